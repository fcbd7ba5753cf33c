// Host<->device traffic of the offload modes (see offload_traffic.h).
#include "offload_traffic.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/grad/gradient_pipeline.h"

namespace kv {

namespace {
size_t bytes(const Tensor& t) { return t.defined() ? t.nbytes() : 0; }

size_t layer_bytes(const LayerWeights& w) {
    return bytes(w.attn_norm) + bytes(w.wqkv) + bytes(w.bqkv) + bytes(w.q_norm) + bytes(w.k_norm) + bytes(w.wo) + bytes(w.bo) +
           bytes(w.mlp_norm) + bytes(w.w_gate_up) + bytes(w.w_down) + bytes(w.router) + bytes(w.router_bias) +
           bytes(w.experts_gate_up) + bytes(w.experts_gate_up_bias) + bytes(w.experts_down) + bytes(w.experts_down_bias);
}
}  // namespace

OffloadTraffic offload_traffic(const Transformer& m, const Lora* lora, int64_t layers_per_cell) {
    const int nl = int(m.config().num_layers);
    auto adapter_bytes = [&](int l0, int l1) {  // adapters of layers [l0, l1); l0 = -1: the head
        size_t n = 0;
        if (!lora) return n;
        for (const auto& a : lora->adapters())
            if ((l0 < 0 && a.layer < 0) || (l0 >= 0 && a.layer >= l0 && a.layer < l1)) n += bytes(a.A) + bytes(a.B);
        return n;
    };
    OffloadTraffic tr;
    OffloadShard emb{"embedding", bytes(m.embedding()), lora ? 0 : bytes(m.embedding())};
    tr.shards.push_back(emb);
    for (auto [a, b] : gradient_rows(nl, layers_per_cell)) {
        OffloadShard s;
        s.name = b - a == 1 ? str("layer ", a) : str("layers ", a, "-", b - 1);
        for (int l = a; l < b; ++l) s.weight_bytes += layer_bytes(m.layer(l));
        const size_t ad = adapter_bytes(a, b);
        s.trainable_bytes = lora ? ad : s.weight_bytes;
        s.weight_bytes += ad;
        tr.shards.push_back(s);
    }
    OffloadShard head{"head (norm + lm_head)", bytes(m.final_norm_weight()), 0};
    if (!m.tied_embeddings()) head.weight_bytes += bytes(m.lm_head_weight());
    else head.weight_bytes += bytes(m.embedding());  // the tied head is the embedding, cloned again
    const size_t head_ad = adapter_bytes(-1, 0);
    head.trainable_bytes = lora ? head_ad : bytes(m.final_norm_weight()) + (m.tied_embeddings() ? 0 : bytes(m.lm_head_weight()));
    head.weight_bytes += head_ad;
    tr.shards.push_back(head);
    // phase 1: every shard once; phase 2: head, rows, and the embedding only when trained.
    for (const auto& s : tr.shards) {
        tr.h2d_bytes += s.weight_bytes;
        const bool phase2 = s.name != "embedding" || !lora;
        if (phase2) tr.h2d_bytes += s.weight_bytes;
        tr.d2h_bytes += s.trainable_bytes;
        tr.largest_shard_bytes = std::max(tr.largest_shard_bytes, s.weight_bytes);
    }
    return tr;
}

}  // namespace kv
