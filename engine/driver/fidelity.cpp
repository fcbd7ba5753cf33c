// Fidelity against the dense cache (see fidelity.h).
#include "fidelity.h"

#include "chunk_loop.h"

#include "engine/telemetry/run_phase.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_math.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"
#include "engine/telemetry/run_phase.h"
#include "kernels/common/element_math.h"

namespace kv {

FidelityAttention::FidelityAttention(KVCache& cache, const ModelConfig& model, int64_t batch, int64_t seq_length, Device device,
                                     DType dtype)
    : cache_(cache), T_(seq_length) {
    const int nl = int(model.num_layers);
    for (int l = 0; l < nl; ++l) {
        const std::string lbl = str("layer ", l, " fidelity shadow");
        k_shadow_.push_back(Tensor::empty({batch, model.cache_kv_heads(), T_, model.cache_head_dim()}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " k"}));
        v_shadow_.push_back(Tensor::empty({batch, model.cache_kv_heads(), T_, model.cache_head_dim()}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " v"}));
    }
    chunk_.assign(size_t(nl), 0);
}

size_t FidelityAttention::shadow_bytes() const {
    size_t b = y0_.defined() ? y0_.nbytes() : 0;
    for (size_t l = 0; l < k_shadow_.size(); ++l) b += k_shadow_[l].nbytes() + v_shadow_[l].nbytes();
    return b;
}

void FidelityAttention::set_rope_frequencies(const std::vector<double>* inv_freq) { cache_.set_rope_frequencies(inv_freq); }
void FidelityAttention::set_output_projection(int layer, const Tensor& wo) { cache_.set_output_projection(layer, wo); }
void FidelityAttention::set_layer_input(int layer, const Tensor& h) { cache_.set_layer_input(layer, h); }

namespace {

// Whether a buffer holds the raw K/V it was given: full precision in the activations' dtype (the
// buffers name themselves by it). Quantized, KIVI, paged and offloaded buffers do not qualify.
bool stores_raw(const KVBuffer& b, DType act) {
    const std::string nm = b.name();
    return (act == DType::F32 && nm == "f32") || (act == DType::BF16 && nm == "bf16") || (act == DType::F16 && nm == "f16") ||
           (act == DType::F64 && nm == "f64");
}

}  // namespace

double dropped_weight(const float* w, const char* held, int64_t end, double* oracle_lost) {
    std::vector<float> all(w, w + end), gone;
    for (int64_t t = 0; t < end; ++t)
        if (!held[t]) gone.push_back(w[t]);
    std::sort(all.begin(), all.end());
    std::sort(gone.begin(), gone.end());
    // The i-th lightest of all positions weighs at most the i-th lightest dropped one: summed
    // in this order, term by term, the oracle's loss cannot round above the policy's.
    double dropped = 0, lost = 0;
    for (size_t i = 0; i < gone.size(); ++i) dropped += double(gone[i]), lost += double(all[i]);
    if (oracle_lost) *oracle_lost = lost;
    return dropped;
}

AttentionMerge merge_attention(const double* ya, const double* lse_a, const double* ye, const double* lse_e, int64_t rows, int64_t HS,
                               double* y_out, double* mass_out) {
    AttentionMerge m;
    for (int64_t r = 0; r < rows; ++r) {
        const double la = lse_a[r], le = lse_e[r];
        // Shares of the union's softmax mass; a side a row cannot see gets exactly 0.
        double wa = 1, we = 0;
        if (le == -INFINITY) {
            wa = la == -INFINITY ? 0.0 : 1.0;
        } else if (la == -INFINITY) {
            wa = 0, we = 1;
        } else {
            const double mx = std::max(la, le), ea = std::exp(la - mx), ee = std::exp(le - mx);
            wa = ea / (ea + ee), we = ee / (ea + ee);
        }
        const double *a = ya + r * HS, *e = ye + r * HS;
        for (int64_t d = 0; d < HS; ++d) {
            const double full = wa * a[d] + we * e[d];
            const double diff = we * (a[d] - e[d]);  // a - full, without the cancellation
            m.diff_sq += diff * diff;
            m.full_sq += full * full;
            if (y_out) y_out[r * HS + d] = full;
        }
        m.mass_a += wa;
        if (mass_out) mass_out[r] = wa;
    }
    return m;
}

void FidelityAttention::attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                               Tensor& y, const ChunkInput& in) {
    const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), G = k.size(1), HS = q.size(3), end = input_pos + n;
    if (size_t(layer) >= k_shadow_.size() || end > T_ || B != k_shadow_[size_t(layer)].size(0))
        throw Error(str("fidelity: layer ", layer, " chunk at positions ", input_pos, "+", n, " (batch ", B,
                        ") is outside the shadow sized for ", k_shadow_.size(), " layers, ", T_, " tokens"));
    LayerCache& lc = cache_.layer(layer);
    // The merge path needs the policy's attention as the plain SDPA over raw K/V, with its
    // per-row log-sum-exp (see fidelity.h).
    const bool want_lse = merge_ && input_pos > 0 && stores_raw(lc.buffer(), q.dtype()) && ops::sdpa_lse_supported(q.device());
    Tensor lse_kept;
    if (want_lse) {
        InstrumentationScope instrumentation;  // only measuring asks for it
        lse_kept = Tensor::empty({B, NH, n}, DType::F64, {q.device(), MemCategory::WORKSPACE, "fidelity kept log-sum-exp"});
    }
    ChunkInput call = in;
    call.lse = want_lse ? &lse_kept : nullptr;
    cache_.attend(layer, q, k, v, input_pos, scale, window, y, call);
    // The policy's attention is done; the rest measures it (memory and time apart from the run's).
    InstrumentationScope instrumentation;
    PhaseScope phase(RunPhase::FIDELITY_ATTENTION);

    if (input_pos == 0) chunk_[size_t(layer)] = 0;
    Tensor ks = k_shadow_[size_t(layer)].slice(2, input_pos, end), vs = v_shadow_[size_t(layer)].slice(2, input_pos, end);
    ops::copy_(ks, k);
    ops::copy_(vs, v);

    // Which positions each (b, g) row held when it attended: the kept mass is 1 - the full
    // attention's share on the others, an empty sum (exactly 1) when nothing was dropped, and
    // then the full attention's weight sums are not needed at all.
    const KVPolicy& pol = lc.policy();
    const std::vector<int32_t>& pos = pol.token_positions();
    // Per-head lengths: a row is the pool (-1 where another head keeps the slot).
    const int64_t L = pol.position_row_length(), Tc = pol.position_row_filled();
    std::vector<char> held(size_t(B * G * end), 0);
    std::vector<int64_t> evicted(size_t(B * G), 0);
    bool dropped_any = false, slots_distinct = true;
    for (int64_t r = 0; r < B * G; ++r) {
        const int32_t* p = pos.data() + (pol.per_row_positions() ? r * L : 0);
        char* h = held.data() + r * end;
        int64_t count = 0;
        for (int64_t s = 0; s < Tc; ++s)
            if (p[s] >= 0 && p[s] < end && !h[p[s]]) h[p[s]] = 1, ++count;
        dropped_any = dropped_any || count < end;
        slots_distinct = slots_distinct && count == Tc;  // every slot the SDPA read is one held position
        evicted[size_t(r)] = end - count;
    }
    // The policy attended over exactly the held positions' raw K/V: its output and log-sum-exp
    // are the held half of full attention. The oracle needs the weight on every position, which
    // the merge does not compute: where something was dropped it takes the full path.
    const bool merge = want_lse && lc.lse_written() && slots_distinct && !(oracle_ && dropped_any);

    FidelityStep st;
    st.layer = layer;
    st.chunk = chunk_[size_t(layer)]++;
    st.input_pos = input_pos;
    st.n = n;
    MemoryLabelScope label(str("layer ", layer, " fidelity"));
    Tensor y_full;  // layer 0 only (the dense stream's layer 0 takes it)
    if (!dropped_any && (input_pos == 0 || merge)) {
        // Nothing dropped and the attention ran on raw K/V (the prefill attends over the chunk's
        // own k, v): y is full attention, with error 0 and mass 1 exactly.
        y_full = y;
    } else if (merge) {
        // Full attention = the policy's (held positions) merged with attention over the evicted
        // positions alone, gathered out of the shadow, by the two log-sum-exps: no second pass
        // over the held positions, no weight sums.
        int64_t E = 0;
        for (int64_t e : evicted) E = std::max(E, e);
        std::vector<int32_t> idx(size_t(B * G * E), 0), kp(size_t(B * G * E), std::numeric_limits<int32_t>::max());
        for (int64_t r = 0; r < B * G; ++r) {
            const char* h = held.data() + r * end;
            int64_t j = 0;
            for (int64_t t = 0; t < end; ++t)
                if (!h[t]) idx[size_t(r * E + j)] = int32_t(t), kp[size_t(r * E + j++)] = int32_t(t);
        }  // rows with fewer pad with slot 0 at a position no query sees
        const Device dev = q.device();
        const Tensor index = Tensor::from_i32({B, G, E, 1}, idx, {dev, MemCategory::WORKSPACE, "fidelity evicted slots"}).expand({B, G, E, HS});
        const Tensor Ke = ops::gather(k_shadow_[size_t(layer)].slice(2, 0, end), 2, index);
        const Tensor Ve = ops::gather(v_shadow_[size_t(layer)].slice(2, 0, end), 2, index);
        const Tensor kpos = Tensor::from_i32({B, G, E}, kp, {dev, MemCategory::WORKSPACE, "fidelity evicted positions"});
        Tensor ye = Tensor::empty({B, NH, n, HS}, q.dtype(), {dev, MemCategory::WORKSPACE, "fidelity evicted y"});
        Tensor lse_e = Tensor::empty({B, NH, n}, DType::F64, {dev, MemCategory::WORKSPACE, "fidelity evicted log-sum-exp"});
        ops::sdpa_(ye, q, Ke, Ve, kpos, position_range(input_pos, n, dev), scale, window, nullptr, &lse_e);
        const std::vector<double> ya = y.to_f64_vector(), yev = ye.to_f64_vector(), la = lse_kept.to_f64_vector(), le = lse_e.to_f64_vector();
        std::vector<double> full(layer == 0 ? ya.size() : 0);
        const AttentionMerge m = merge_attention(ya.data(), la.data(), yev.data(), le.data(), B * NH * n, HS, layer == 0 ? full.data() : nullptr, nullptr);
        st.attn_rel_error = m.full_sq > 0 ? std::sqrt(m.diff_sq / m.full_sq) : (m.diff_sq > 0 ? INFINITY : 0.0);
        st.kept_mass = m.mass_a / double(B * NH * n);
        if (layer == 0) y_full = Tensor::from_f64({B, NH, n, HS}, full, q.dtype(), {dev, MemCategory::WORKSPACE, "fidelity y"});
        ++merged_steps_;
    } else {
        // Full attention: the same queries over every position so far, masked causally by position
        // (and by the layer's window: keys it hides are no loss of the policy's).
        const Tensor K = k_shadow_[size_t(layer)].slice(2, 0, end), V = v_shadow_[size_t(layer)].slice(2, 0, end);
        Tensor kpos = position_range(0, end, q.device()).unsqueeze(0);  // (1, 1, end)
        Tensor qpos = position_range(input_pos, n, q.device());
        y_full = Tensor::empty({B, NH, n, HS}, q.dtype(), {q.device(), MemCategory::WORKSPACE, "fidelity y"});
        Tensor ws;
        if (dropped_any) ws = Tensor::empty({B, G, end}, DType::F32, {q.device(), MemCategory::WORKSPACE, "fidelity weight sums"});
        ops::sdpa_(y_full, q, K, V, kpos, qpos, scale, window, dropped_any ? &ws : nullptr);
        const std::vector<double> a = y.to_f64_vector(), b = y_full.to_f64_vector();
        double num = 0, den = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            const double d = a[i] - b[i];
            num += d * d;
            den += b[i] * b[i];
        }
        st.attn_rel_error = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
        if (dropped_any) {
            // ws[b, g, t]: weight on position t summed over the chunk's queries, averaged over the
            // group's heads, so each (b, g) row sums to n.
            const std::vector<float> w = ws.to_f32_vector();
            double dropped = 0, oracle_lost = 0;
            for (int64_t r = 0; r < B * G; ++r) {
                double lost = 0;
                dropped += dropped_weight(w.data() + r * end, held.data() + r * end, end, &lost);
                oracle_lost += lost;
            }
            st.kept_mass = 1.0 - dropped / double(n * B * G);
            if (oracle_) {
                st.oracle_mass = 1.0 - oracle_lost / double(n * B * G);
                st.efficiency = st.oracle_mass > 0 ? st.kept_mass / st.oracle_mass : 1.0;
            }
        }
    }
    if (layer == 0) {
        if (!y0_.defined())
            y0_ = Tensor::empty({B, NH, T_, HS}, q.dtype(), {q.device(), MemCategory::KV_FIDELITY, "layer 0 fidelity full attention"});
        Tensor dst = y0_.slice(2, input_pos, end);
        ops::copy_(dst, y_full);
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
        o.oracle_mass += s.oracle_mass;
        o.efficiency += s.efficiency;
    }
    std::vector<FidelityLayerSummary> out;
    for (auto& [l, o] : m) {
        o.attn_rel_error /= double(o.steps);
        o.kept_mass /= double(o.steps);
        o.oracle_mass /= double(o.steps);
        o.efficiency /= double(o.steps);
        out.push_back(o);
    }
    return out;
}

class DenseReference::Shadow final : public LayerAttention {
   public:
    Shadow(const ModelConfig& mc, int64_t B, int64_t T, Device device, DType dtype, const FidelityAttention* policy)
        : T_(T), policy_(policy) {
        for (int l = 0; l < int(mc.num_layers); ++l) {
            const std::string lbl = str("layer ", l, " dense reference");
            k_.push_back(Tensor::empty({B, mc.cache_kv_heads(), T, mc.cache_head_dim()}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " k"}));
            v_.push_back(Tensor::empty({B, mc.cache_kv_heads(), T, mc.cache_head_dim()}, dtype, {device, MemCategory::KV_FIDELITY, lbl + " v"}));
        }
    }
    // Causal attention over every position so far, within the layer's window (no weight sums:
    // nothing reads them).
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        const int64_t B = q.size(0), n = q.size(2), end = input_pos + n;
        if (size_t(layer) >= k_.size() || end > T_ || B != k_[size_t(layer)].size(0))
            throw Error(str("fidelity: dense reference of layer ", layer, " at positions ", input_pos, "+", n, " (batch ", B,
                            ") is outside the shadow sized for ", k_.size(), " layers, ", T_, " tokens"));
        if (layer == 0 && policy_) {  // the embeddings are the policy's: so is layer 0's full attention
            ops::copy_(y, policy_->full_output0(input_pos, end));
            return;
        }
        Tensor ks = k_[size_t(layer)].slice(2, input_pos, end), vs = v_[size_t(layer)].slice(2, input_pos, end);
        ops::copy_(ks, k);
        ops::copy_(vs, v);
        MemoryLabelScope label(str("layer ", layer, " dense reference"));
        Tensor kpos = position_range(0, end, q.device()).unsqueeze(0);
        Tensor qpos = position_range(input_pos, n, q.device());
        ops::sdpa_(y, q, k_[size_t(layer)].slice(2, 0, end), v_[size_t(layer)].slice(2, 0, end), kpos, qpos, scale, window, nullptr);
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
    const FidelityAttention* policy_;  // layer 0's attention comes from it, when given
    std::vector<Tensor> k_, v_;
};

DenseReference::DenseReference(const Transformer& model, int64_t batch, int64_t seq_length, const FidelityAttention* policy,
                               int64_t kl_positions)
    : model_(model),
      policy_(policy),
      kl_positions_(kl_positions),
      B_(batch),
      T_(seq_length),
      shadow_(std::make_unique<Shadow>(model.config(), batch, seq_length, model.options().device, model.act_dtype(), policy)) {}

DenseReference::~DenseReference() = default;

size_t DenseReference::shadow_bytes() const { return shadow_->bytes() + (policy_out_.defined() ? policy_out_.nbytes() : 0); }

namespace {

// KL(softmax(a) || softmax(b)) of one row of V logits, in nats.
// always_inline puts the body into each ISA-specific caller below (this file is built for the
// x86-64-v2 baseline, where it runs 4 lanes wide); ASan builds refuse always_inline across
// target attributes, so they keep the baseline only (as engine/kv/policies/policy_math.cpp).
#if defined(__SANITIZE_ADDRESS__)
#define KV_KL_INLINE inline
#else
#define KV_KL_INLINE __attribute__((always_inline)) inline
#endif
KV_KL_INLINE double kl_row_body(const float* a, const float* b, int64_t V) {
    float ma = -INFINITY, mb = -INFINITY;
#pragma omp simd reduction(max : ma, mb)
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
    return std::max(kl, 0.0);  // rounding can leave a tiny negative sum for near-equal rows
}

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target("arch=x86-64-v4"))) double kl_row_v4(const float* a, const float* b, int64_t V) { return kl_row_body(a, b, V); }
__attribute__((target("arch=x86-64-v3"))) double kl_row_v3(const float* a, const float* b, int64_t V) { return kl_row_body(a, b, V); }
#endif

double kl_row(const float* a, const float* b, int64_t V) {
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
    const int level = policy_matmul_level();  // the CPU level the policies' products use (KVLAB_CPU_VARIANT caps it)
    if (level >= 4) return kl_row_v4(a, b, V);
    if (level >= 3) return kl_row_v3(a, b, V);
#endif
    return kl_row_body(a, b, V);
}

}  // namespace

double mean_kl_of_logits(const std::vector<float>& p, const std::vector<float>& q, int64_t rows, int64_t V) {
    if (int64_t(p.size()) != rows * V || int64_t(q.size()) != rows * V)
        throw Error(str("fidelity: KL of ", p.size(), " and ", q.size(), " logits; expected ", rows, " rows of ", V));
    double total = 0;
    for (int64_t r = 0; r < rows; ++r) total += kl_row(p.data() + r * V, q.data() + r * V, V);
    return rows > 0 ? total / double(rows) : 0.0;
}

void DenseReference::run_cell(const Tensor& ids, const ChunkPlan& plan, size_t cell, const std::vector<Tensor>& policy_outputs) {
    const auto [c0, c1] = plan.cells.at(cell);
    if (policy_outputs.size() != c1 - c0)
        throw Error(str("fidelity: cell ", cell, " has ", policy_outputs.size(), " policy outputs; expected ", c1 - c0));
    if (cell == 0) exact_end_ = 0, steps_.clear();  // a new sequence
    for (size_t c = c0; c < c1; ++c) {
        const int64_t p0 = plan.starts[c], n = plan.chunks[c];
        // The exact prefix: the policy's stream is the dense one there, so its KL is exactly 0.
        if (exact_end_ == int64_t(c) && policy_ && policy_->prefix_exact(int64_t(c))) {
            exact_end_ = int64_t(c) + 1;
            FidelityKLStep st;
            st.chunk = int64_t(c);
            st.input_pos = p0;
            st.n = n;
            st.next_token_kl = 0.0;
            steps_.push_back(st);
            continue;
        }
        // Past it, the policy's final-layer outputs wait for the dense stream (after the last cell).
        const Tensor& x = policy_outputs[c - c0];
        if (p0 + n > T_ || x.size(0) != B_)
            throw Error(str("fidelity: chunk at positions ", p0, "+", n, " (batch ", x.size(0), ") is outside the dense reference sized for ",
                            T_, " tokens, batch ", B_));
        if (!policy_out_.defined())
            policy_out_ = Tensor::empty({B_, T_, x.size(2)}, x.dtype(), {x.device(), MemCategory::KV_FIDELITY, "fidelity policy outputs"});
        Tensor dst = policy_out_.slice(1, p0, p0 + n);
        ops::copy_(dst, x);
    }
    if (cell + 1 == plan.cells.size()) finish(ids, plan);
}

int64_t DenseReference::progress_units(const ChunkPlan& plan) const {
    return int64_t(plan.chunks.size()) * (model_.config().num_layers + 1);
}

void DenseReference::finish(const Tensor& ids, const ChunkPlan& plan) {
    const size_t nc = plan.chunks.size(), ce = size_t(exact_end_);
    const int nl = int(model_.config().num_layers);
    auto report = [&](int64_t units, const char* phase) {
        if (progress_ && units > 0) progress_(units, phase);
    };
    report(int64_t(std::min(ce, nc)) * (nl + 1), run_phase_name(RunPhase::FIDELITY_REFERENCE));  // the exact prefix: nothing to run
    if (ce >= nc) return;
    // The exact prefix's K/V are the policy's (its shadow); the dense stream starts after it.
    const int64_t pe = plan.starts[ce];
    if (pe > 0)
        for (int l = 0; l < nl; ++l) shadow_->set(l, 0, pe, policy_->shadow_k(l, 0, pe), policy_->shadow_v(l, 0, pe));
    // The rest of the sequence in blocks of up to block_tokens_ (whole chunks): a block is one
    // prefill, with larger matmuls than the policy's chunk-sized steps, and activations that
    // stay bounded on long sequences. The blocks are the chunks (one per cell) of the loop's plan.
    ChunkPlan blocks;
    std::vector<std::pair<size_t, size_t>> block_chunks;  // per block: the plan's chunks [a, b)
    for (size_t a = ce; a < nc;) {
        size_t b = a + 1;
        while (b < nc && plan.starts[b] + plan.chunks[b] - plan.starts[a] <= block_tokens_) ++b;
        blocks.starts.push_back(plan.starts[a]);
        blocks.chunks.push_back(plan.starts[b - 1] + plan.chunks[b - 1] - plan.starts[a]);
        blocks.cells.push_back({block_chunks.size(), block_chunks.size() + 1});
        block_chunks.push_back({a, b});
        a = b;
    }
    ChunkLoopHooks hooks;
    hooks.inputs = [&](size_t k) {
        return std::vector<Tensor>{model_.embed(ids.slice(1, blocks.starts[k], blocks.starts[k] + blocks.chunks[k]))};
    };
    hooks.attention = [&](int, size_t) -> LayerAttention& { return *shadow_; };
    hooks.after_layer = [&](int, size_t k) {
        report(int64_t(block_chunks[k].second - block_chunks[k].first), run_phase_name(RunPhase::FIDELITY_REFERENCE));
    };
    hooks.after_cell = [&](size_t k, std::vector<Tensor>& xs) {
        const auto [a, b] = block_chunks[k];
        const int64_t q0 = blocks.starts[k], q1 = q0 + blocks.chunks[k];
        PhaseScope kl_heads(RunPhase::KL_HEADS);  // both streams' final norm, lm_head and the KL
        const Tensor hd = model_.final_norm(xs[0]), hp = model_.final_norm(policy_out_.slice(1, q0, q1));
        for (size_t c = a; c < b; ++c) {
            const int64_t o = plan.starts[c] - q0, n = plan.chunks[c];
            FidelityKLStep st;
            st.chunk = int64_t(c);
            st.input_pos = plan.starts[c];
            st.n = n;
            st.next_token_kl = chunk_kl(hd.slice(1, o, o + n), hp.slice(1, o, o + n), plan.starts[c]);
            steps_.push_back(st);
            report(1, run_phase_name(RunPhase::KL_HEADS));
        }
    };
    run_chunk_loop(model_, blocks, hooks);
    policy_out_ = Tensor{};
}

double DenseReference::chunk_kl(Tensor hd, Tensor hp, int64_t input_pos) const {
    const int64_t B = hd.size(0), n0 = hd.size(1), E = hd.size(2);
    if (kl_positions_ > 0 && kl_positions_ < n0) {  // the sampled positions, gathered into one block
        std::vector<int32_t> at;
        for (int64_t i = 0; i < kl_positions_; ++i) at.push_back(int32_t((i + 1) * n0 / kl_positions_ - 1));
        const int64_t m = int64_t(at.size());
        const Tensor idx = Tensor::from_i32({1, m, 1}, at, {hd.device(), MemCategory::WORKSPACE, "fidelity KL positions"}).expand({B, m, E});
        hd = ops::gather(hd, 1, idx);
        hp = ops::gather(hp, 1, idx);
    }
    const int64_t n = hd.size(1);
    if (n == 0) return 0.0;
    // Both streams' rows through one lm_head call ([dense rows, policy rows] per batch row), 64
    // positions at a time: one pass over the vocabulary matrix instead of two, and 2 x B x 64 x V
    // logits on the host at a time.
    constexpr int64_t kRows = 64;
    double sum = 0;
    for (int64_t a = 0; a < n; a += kRows) {
        const int64_t e = std::min(n, a + kRows), r = e - a;
        Tensor both = Tensor::empty({B, 2 * r, E}, hd.dtype(), {hd.device(), MemCategory::WORKSPACE, "fidelity KL rows"});
        Tensor lo = both.slice(1, 0, r), hi = both.slice(1, r, 2 * r);
        ops::copy_(lo, hd.slice(1, a, e));
        ops::copy_(hi, hp.slice(1, a, e));
        const Tensor z = model_.lm_head(both, input_pos + a);
        const int64_t V = z.size(2);
        // Host f32 logits are read in place (a copy would be another 2 x B x 64 x V floats).
        std::vector<float> host;
        const float* zv = nullptr;
        if (z.device().type == DeviceType::CPU && z.dtype() == DType::F32 && z.is_contiguous()) {
            zv = static_cast<const float*>(z.data_ptr());
        } else {
            host = z.to_f32_vector();
            zv = host.data();
        }
        for (int64_t bb = 0; bb < B; ++bb)
            for (int64_t i = 0; i < r; ++i) sum += kl_row(zv + (bb * 2 * r + i) * V, zv + (bb * 2 * r + r + i) * V, V);
    }
    return sum / double(B * n);
}

double mean_next_token_kl(const std::vector<FidelityKLStep>& steps) {
    if (steps.empty()) return -1;
    double s = 0;
    for (const FidelityKLStep& k : steps) s += k.next_token_kl;
    return s / double(steps.size());
}

}  // namespace kv
