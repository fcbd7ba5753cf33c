// Fidelity against the dense cache (see fidelity.h).
#include "fidelity.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "kernels/common/element_math.h"

namespace kv {

FidelityAttention::FidelityAttention(KVCache& cache, const ModelConfig& model, int64_t batch, int64_t seq_length, Device device,
                                     DType dtype)
    : cache_(cache), T_(seq_length) {
    const int nl = int(model.num_layers);
    for (int l = 0; l < nl; ++l) {
        const std::string lbl = str("layer ", l, " fidelity shadow");
        k_shadow_.push_back(Tensor::empty({batch, model.num_kv_heads, T_, model.head_dim}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " k"}));
        v_shadow_.push_back(Tensor::empty({batch, model.num_kv_heads, T_, model.head_dim}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " v"}));
    }
    chunk_.assign(size_t(nl), 0);
}

size_t FidelityAttention::shadow_bytes() const {
    size_t b = 0;
    for (size_t l = 0; l < k_shadow_.size(); ++l) b += k_shadow_[l].nbytes() + v_shadow_[l].nbytes();
    return b;
}

void FidelityAttention::set_rope_frequencies(const std::vector<double>* inv_freq) { cache_.set_rope_frequencies(inv_freq); }

void FidelityAttention::attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, Tensor& y) {
    cache_.attend(layer, q, k, v, input_pos, scale, y);

    const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), G = k.size(1), end = input_pos + n;
    if (size_t(layer) >= k_shadow_.size() || end > T_ || B != k_shadow_[size_t(layer)].size(0))
        throw Error(str("fidelity: layer ", layer, " chunk at positions ", input_pos, "+", n, " (batch ", B,
                        ") is outside the shadow sized for ", k_shadow_.size(), " layers, ", T_, " tokens"));
    if (input_pos == 0) chunk_[size_t(layer)] = 0;
    Tensor ks = k_shadow_[size_t(layer)].slice(2, input_pos, end), vs = v_shadow_[size_t(layer)].slice(2, input_pos, end);
    ops::copy_(ks, k);
    ops::copy_(vs, v);

    // Which positions each (b, g) row held when it attended: the kept mass is 1 - the full
    // attention's share on the others, an empty sum (exactly 1) when nothing was dropped, and
    // then the full attention's weight sums are not needed at all.
    const KVPolicy& pol = cache_.layer(layer).policy();
    const std::vector<int32_t>& pos = pol.token_positions();
    // Per-head lengths: a row is the pool (-1 where another head keeps the slot).
    const int64_t L = pol.pool_slots() ? pol.pool_slots() : pol.cache_length(), Tc = pol.pool_slots() ? L : pol.current_length();
    std::vector<char> held(size_t(B * G * end), 0);
    bool dropped_any = false;
    for (int64_t r = 0; r < B * G; ++r) {
        const int32_t* p = pos.data() + (pol.per_row_positions() ? r * L : 0);
        char* h = held.data() + r * end;
        int64_t count = 0;
        for (int64_t s = 0; s < Tc; ++s)
            if (p[s] >= 0 && p[s] < end && !h[p[s]]) h[p[s]] = 1, ++count;
        dropped_any = dropped_any || count < end;
    }

    // Full attention: the same queries over every position so far, masked causally by position.
    MemoryLabelScope label(str("layer ", layer, " fidelity"));
    const Tensor K = k_shadow_[size_t(layer)].slice(2, 0, end), V = v_shadow_[size_t(layer)].slice(2, 0, end);
    Tensor kpos = position_range(0, end, q.device()).unsqueeze(0);  // (1, 1, end)
    Tensor qpos = position_range(input_pos, n, q.device());
    Tensor y_full = Tensor::empty({B, NH, n, q.size(3)}, q.dtype(), {q.device(), MemCategory::WORKSPACE, "fidelity y"});
    Tensor ws;
    if (dropped_any) ws = Tensor::empty({B, G, end}, DType::F32, {q.device(), MemCategory::WORKSPACE, "fidelity weight sums"});
    ops::sdpa_(y_full, q, K, V, kpos, qpos, scale, 0, dropped_any ? &ws : nullptr);

    FidelityStep st;
    st.layer = layer;
    st.chunk = chunk_[size_t(layer)]++;
    st.input_pos = input_pos;
    st.n = n;
    {
        const std::vector<double> a = y.to_f64_vector(), b = y_full.to_f64_vector();
        double num = 0, den = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            const double d = a[i] - b[i];
            num += d * d;
            den += b[i] * b[i];
        }
        st.attn_rel_error = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
    }
    if (dropped_any) {
        // ws[b, g, t]: weight on position t summed over the chunk's queries, averaged over the
        // group's heads, so each (b, g) row sums to n.
        const std::vector<float> w = ws.to_f32_vector();
        double dropped = 0;
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t t = 0; t < end; ++t)
                if (!held[size_t(r * end + t)]) dropped += double(w[size_t(r * end + t)]);
        st.kept_mass = 1.0 - dropped / double(n * B * G);
    }
    if (st.chunk == 0 && layer == 0) chunk_exact_.clear();  // a new sequence (layer 0 attends first)
    if (int64_t(chunk_exact_.size()) <= st.chunk) chunk_exact_.resize(size_t(st.chunk + 1), 1);
    if (st.attn_rel_error != 0.0) chunk_exact_[size_t(st.chunk)] = 0;
    steps_.push_back(st);
}

bool FidelityAttention::prefix_exact(int64_t chunk) const {
    if (chunk < 0 || chunk >= int64_t(chunk_exact_.size())) return false;
    for (int64_t c = 0; c <= chunk; ++c)
        if (!chunk_exact_[size_t(c)]) return false;
    return true;
}

std::vector<FidelityLayerSummary> summarize_fidelity(const std::vector<FidelityStep>& steps) {
    std::map<int, FidelityLayerSummary> m;
    for (const FidelityStep& s : steps) {
        FidelityLayerSummary& o = m[s.layer];
        o.layer = s.layer;
        o.steps += 1;
        o.attn_rel_error += s.attn_rel_error;
        o.kept_mass += s.kept_mass;
    }
    std::vector<FidelityLayerSummary> out;
    for (auto& [l, o] : m) {
        o.attn_rel_error /= double(o.steps);
        o.kept_mass /= double(o.steps);
        out.push_back(o);
    }
    return out;
}

class DenseReference::Shadow final : public LayerAttention {
   public:
    Shadow(const ModelConfig& mc, int64_t B, int64_t T, Device device, DType dtype) : T_(T) {
        for (int l = 0; l < int(mc.num_layers); ++l) {
            const std::string lbl = str("layer ", l, " dense reference");
            k_.push_back(Tensor::empty({B, mc.num_kv_heads, T, mc.head_dim}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " k"}));
            v_.push_back(Tensor::empty({B, mc.num_kv_heads, T, mc.head_dim}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " v"}));
        }
    }
    // Causal attention over every position so far (no weight sums: nothing reads them).
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, Tensor& y) override {
        const int64_t B = q.size(0), n = q.size(2), end = input_pos + n;
        if (size_t(layer) >= k_.size() || end > T_ || B != k_[size_t(layer)].size(0))
            throw Error(str("fidelity: dense reference of layer ", layer, " at positions ", input_pos, "+", n, " (batch ", B,
                            ") is outside the shadow sized for ", k_.size(), " layers, ", T_, " tokens"));
        Tensor ks = k_[size_t(layer)].slice(2, input_pos, end), vs = v_[size_t(layer)].slice(2, input_pos, end);
        ops::copy_(ks, k);
        ops::copy_(vs, v);
        MemoryLabelScope label(str("layer ", layer, " dense reference"));
        Tensor kpos = position_range(0, end, q.device()).unsqueeze(0);
        Tensor qpos = position_range(input_pos, n, q.device());
        ops::sdpa_(y, q, k_[size_t(layer)].slice(2, 0, end), v_[size_t(layer)].slice(2, 0, end), kpos, qpos, scale, 0, nullptr);
    }
    // Positions [p0, p1) of layer l taken as given (the policy's exact prefix).
    void set(int layer, int64_t p0, int64_t p1, const Tensor& k, const Tensor& v) {
        Tensor ks = k_[size_t(layer)].slice(2, p0, p1), vs = v_[size_t(layer)].slice(2, p0, p1);
        ops::copy_(ks, k);
        ops::copy_(vs, v);
    }
    size_t bytes() const {
        size_t b = 0;
        for (size_t l = 0; l < k_.size(); ++l) b += k_[l].nbytes() + v_[l].nbytes();
        return b;
    }

   private:
    int64_t T_;
    std::vector<Tensor> k_, v_;
};

DenseReference::DenseReference(const Transformer& model, int64_t batch, int64_t seq_length, const FidelityAttention* policy,
                               int64_t kl_positions)
    : model_(model), policy_(policy), kl_positions_(kl_positions), shadow_(std::make_unique<Shadow>(model.config(), batch, seq_length, model.options().device, model.act_dtype())) {}

DenseReference::~DenseReference() = default;

size_t DenseReference::shadow_bytes() const { return shadow_->bytes(); }

double mean_kl_of_logits(const std::vector<float>& p, const std::vector<float>& q, int64_t rows, int64_t V) {
    if (int64_t(p.size()) != rows * V || int64_t(q.size()) != rows * V)
        throw Error(str("fidelity: KL of ", p.size(), " and ", q.size(), " logits; expected ", rows, " rows of ", V));
    double total = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* a = p.data() + r * V;
        const float* b = q.data() + r * V;
        float ma = -INFINITY, mb = -INFINITY;
        for (int64_t i = 0; i < V; ++i) ma = std::max(ma, a[i]), mb = std::max(mb, b[i]);
        // One pass, two exps per entry: KL = sum_i p_i (a_i - b_i) - lse(a) + lse(b), with
        // sum_i p_i (a_i - b_i) = S / za, S = sum_i exp(a_i - ma) (a_i - b_i). The exps in f32
        // (kv_exp vectorizes; about 1 ulp) and every sum in f64: 20x faster than f64 exps, and
        // identical rows still give S = 0 and equal log-sum-exps: exactly 0.
        double za = 0, zb = 0, S = 0;
#pragma omp simd reduction(+ : za, zb, S)
        for (int64_t i = 0; i < V; ++i) {
            const float ea = kv_exp(a[i] - ma), eb = kv_exp(b[i] - mb);
            za += double(ea);
            zb += double(eb);
            S += double(ea) * (double(a[i]) - double(b[i]));
        }
        const double kl = S / za - (double(ma) + std::log(za)) + (double(mb) + std::log(zb));
        total += std::max(kl, 0.0);  // rounding can leave a tiny negative sum for near-equal rows
    }
    return rows > 0 ? total / double(rows) : 0.0;
}

void DenseReference::run_cell(const Tensor& ids, const ChunkPlan& plan, size_t cell, const std::vector<Tensor>& policy_outputs) {
    const auto [c0, c1] = plan.cells.at(cell);
    if (policy_outputs.size() != c1 - c0)
        throw Error(str("fidelity: cell ", cell, " has ", policy_outputs.size(), " policy outputs; expected ", c1 - c0));
    const int nl = int(model_.config().num_layers);
    // The exact prefix (a prefix of the cell's chunks): the policy's stream is the dense one.
    size_t ce = c0;
    while (policy_ && ce < c1 && policy_->prefix_exact(int64_t(ce))) ++ce;
    for (size_t c = c0; c < ce; ++c) {
        const int64_t p0 = plan.starts[c], p1 = p0 + plan.chunks[c];
        for (int l = 0; l < nl; ++l) shadow_->set(l, p0, p1, policy_->shadow_k(l, p0, p1), policy_->shadow_v(l, p0, p1));
        FidelityKLStep st;
        st.chunk = int64_t(c);
        st.input_pos = p0;
        st.n = plan.chunks[c];
        st.next_token_kl = 0.0;
        steps_.push_back(st);
    }
    std::vector<Tensor> xs;
    for (size_t c = ce; c < c1; ++c) xs.push_back(model_.embed(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c])));
    // Layer-major like the driver, so the dense stream sees the same chunk boundaries.
    for (int l = 0; l < nl; ++l)
        for (size_t c = ce; c < c1; ++c) xs[c - ce] = model_.block(l, xs[c - ce], plan.starts[c], *shadow_);
    // lm_head over blocks of positions: 2 x B x 64 x V floats on the host at a time.
    constexpr int64_t kRows = 64;
    for (size_t c = ce; c < c1; ++c) {
        Tensor hd = model_.final_norm(xs[c - ce]), hp = model_.final_norm(policy_outputs[c - c0]);
        const int64_t B = hd.size(0), n0 = hd.size(1);
        if (kl_positions_ > 0 && kl_positions_ < n0) {  // the sampled positions, gathered into one block
            std::vector<int32_t> at;
            for (int64_t i = 0; i < kl_positions_; ++i) at.push_back(int32_t((i + 1) * n0 / kl_positions_ - 1));
            const int64_t m = int64_t(at.size()), E = hd.size(2);
            const Tensor idx = Tensor::from_i32({1, m, 1}, at, {hd.device(), MemCategory::WORKSPACE, "fidelity KL positions"}).expand({B, m, E});
            hd = ops::gather(hd, 1, idx);
            hp = ops::gather(hp, 1, idx);
        }
        const int64_t n = hd.size(1);
        double sum = 0;
        for (int64_t a = 0; a < n; a += kRows) {
            const int64_t e = std::min(n, a + kRows);
            const Tensor zd = model_.lm_head(hd.slice(1, a, e), plan.starts[c] + a), zp = model_.lm_head(hp.slice(1, a, e), plan.starts[c] + a);
            sum += mean_kl_of_logits(zd.to_f32_vector(), zp.to_f32_vector(), B * (e - a), zd.size(2)) * double(B * (e - a));
        }
        FidelityKLStep st;
        st.chunk = int64_t(c);
        st.input_pos = plan.starts[c];
        st.n = n0;
        st.next_token_kl = n > 0 ? sum / double(B * n) : 0.0;
        steps_.push_back(st);
    }
}

double mean_next_token_kl(const std::vector<FidelityKLStep>& steps) {
    if (steps.empty()) return -1;
    double s = 0;
    for (const FidelityKLStep& k : steps) s += k.next_token_kl;
    return s / double(steps.size());
}

}  // namespace kv
