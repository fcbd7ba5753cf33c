// Fidelity against the dense cache (see fidelity.h).
#include "fidelity.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/ops/ops.h"

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

    // Full attention: the same queries over every position so far, masked causally by position.
    MemoryLabelScope label(str("layer ", layer, " fidelity"));
    const Tensor K = k_shadow_[size_t(layer)].slice(2, 0, end), V = v_shadow_[size_t(layer)].slice(2, 0, end);
    Tensor kpos = position_range(0, end, q.device()).unsqueeze(0);  // (1, 1, end)
    Tensor qpos = position_range(input_pos, n, q.device());
    Tensor y_full = Tensor::empty({B, NH, n, q.size(3)}, q.dtype(), {q.device(), MemCategory::WORKSPACE, "fidelity y"});
    Tensor ws = Tensor::empty({B, G, end}, DType::F32, {q.device(), MemCategory::WORKSPACE, "fidelity weight sums"});
    ops::sdpa_(y_full, q, K, V, kpos, qpos, scale, 0, &ws);

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
    {
        // ws[b, g, t]: weight on position t summed over the chunk's queries, averaged over the
        // group's heads, so each (b, g) row sums to n. The kept share is 1 - the share on the
        // positions the row no longer holds: an empty sum when nothing was dropped, so exactly 1.
        const std::vector<float> w = ws.to_f32_vector();
        const KVPolicy& pol = cache_.layer(layer).policy();
        const std::vector<int32_t>& pos = pol.token_positions();
        const int64_t L = pol.cache_length(), Tc = pol.current_length();
        std::vector<char> held((size_t)end);
        double dropped = 0;
        for (int64_t r = 0; r < B * G; ++r) {
            const int32_t* p = pos.data() + (pol.per_row_positions() ? r * L : 0);
            std::fill(held.begin(), held.end(), 0);
            for (int64_t s = 0; s < Tc; ++s)
                if (p[s] >= 0 && p[s] < end) held[size_t(p[s])] = 1;
            for (int64_t t = 0; t < end; ++t)
                if (!held[size_t(t)]) dropped += double(w[size_t(r * end + t)]);
        }
        st.kept_mass = 1.0 - dropped / double(n * B * G);
    }
    steps_.push_back(st);
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

}  // namespace kv
