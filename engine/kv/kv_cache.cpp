// KVCache construction and per-layer dispatch (see kv_cache.h).
#include "engine/kv/kv_cache.h"

#include <algorithm>

#include "engine/kv/buffers/buffer_common.h"
#include "engine/core/error.h"
#include "engine/kv/policies/output_projection.h"
#include "engine/kv/window_layer.h"

namespace kv {

KVCache::KVCache(const KVCacheConfig& cfg, const ModelConfig& model, Device device, DType act_dtype, int64_t seq_length,
                 const TextCodec* text)
    : cfg_(apply_kv_budget(cfg, model.num_layers, model.cache_kv_heads(), model.cache_head_dim(), act_dtype, seq_length,
                           model.cache_tensors())) {
    // A latent cache (ModelConfig::latent_cache) is one KV head of [k_pe ; c_kv] whose values are its keys.
    const int64_t G = model.cache_kv_heads(), D = model.cache_head_dim();
    validate_kv_config(cfg_, model.num_layers, D, G);
    int64_t max_L = 0;
    const std::vector<int64_t> Ls = layer_lengths(cfg_, model, seq_length);
    for (int64_t L : Ls) {
        if (L < 1) throw Error("--kv_cache.cache_length is 0 and no sequence length is known; give a cache length");
        max_L = std::max(max_L, L);
    }
    shared_ = make_buffer_shared(cfg_, max_L, G, D, device, act_dtype);
    for (int64_t l = 0; l < model.num_layers; ++l) {
        BufferParams bp{l, Ls[size_t(l)], G, D, device, act_dtype};
        bp.values_are_keys = model.latent_cache();
        // A windowed layer keeps its window by rule; the policy runs on the other layers.
        const int window = model.layer_window(l);
        std::unique_ptr<KVPolicy> policy =
            window > 0 ? make_window_policy(bp.L, bp.G, window) : make_policy(cfg_, bp.L, bp.G, text, l);
        // A latent slot's value is [k_pe ; c_kv], which W_o does not read: ||W_o v|| has no meaning.
        const auto* wo_user = dynamic_cast<const OutputProjectionUser*>(policy.get());
        if (model.latent_cache() && wo_user && wo_user->reads_output_projection())
            throw Error(str("--kv_cache.name: policy '", cfg_.policy(), "' weighs values by the output projection W_o, which a latent "
                            "cache's slots (--model.mla_cache latent) do not feed; expected --model.mla_cache expanded or another policy"));
        // A policy may keep fewer slots than the layer's length (duo's streaming layers).
        bp.L = std::min(bp.L, policy->cache_length());
        if (const int64_t S = pool_slots(*policy); S > 0) {
            // Per-head lengths: one pool of S slots per batch row, shared by the heads.
            if (cfg_.paged_block_size > 0 || cfg_.cpu_offload)
                throw Error(str("--kv_cache.name: policy '", cfg_.policy(), "' keeps per-head lengths in a slot pool, which is neither paged nor offloadable"));
            bp.L = S;
            bp.G = 1;
        }
        layers_.push_back(std::make_unique<LayerCache>(int(l), std::move(policy), make_buffer(cfg_, bp, shared_)));
    }
    if (const PolicyInfo* info = find_policy(cfg_.policy()); info && info->initial_layer_length && (cfg_.paged_block_size > 0 || cfg_.cpu_offload))
        throw Error(str("--kv_cache.name: policy '", cfg_.policy(), "' changes a layer's length during the sequence, which paged and offloaded storage do not support"));
    states_.resize(size_t(model.num_layers));
    for (int64_t l = 0; l < model.num_layers; ++l) stateful_.push_back(!model.has_kv_cache(l));
    for (int64_t l = 0; l < model.num_layers; ++l) kv_source_.push_back(int(model.kv_layer(l)));
    // Policies deciding across layers (cake) see only the layers they run on.
    std::vector<KVPolicy*> all;
    for (size_t l = 0; l < layers_.size(); ++l)
        if (!is_window_policy(layers_[l]->policy()) && !stateful_[l] && !shared_layer(int(l))) all.push_back(&layers_[l]->policy());
    for (KVPolicy* p : all)
        if (CrossLayerLengths* x = p->capabilities().cross_layer_lengths) x->link_layers(all);
}

KVCache::~KVCache() {
    // Buffers detach from the shared state before it goes away.
    layers_.clear();
}

void KVCache::attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                     Tensor& y, const ChunkInput& in) {
    if (layer < 0 || layer >= num_layers()) throw Error(str("KV cache: layer ", layer, " out of range (", num_layers(), " layers)"));
    // Offload: whichever layer comes next (the next cell or decode step after the last) is
    // prefetched while this one computes.
    if (cfg_.cpu_offload && num_layers() > 1) shared_->next = &layers_[size_t((layer + 1) % num_layers())]->buffer();
    layers_[size_t(layer)]->attend(q, k, v, input_pos, scale, window, y, in);
}

void KVCache::attend_shared(int layer, int source, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) {
    if (layer < 0 || layer >= num_layers()) throw Error(str("KV cache: layer ", layer, " out of range (", num_layers(), " layers)"));
    if (source != kv_source(layer))
        throw Error(str("KV cache: layer ", layer, " asks for layer ", source, "'s keys and values; the model's source for it is layer ",
                        kv_source(layer)));
    layers_[size_t(source)]->attend_shared(layer, q, input_pos, scale, window, y);
}

std::pair<int64_t, int64_t> KVCache::offload_restores() const {
    return {shared_->prefetch_hits, shared_->prefetch_misses};
}

bool KVCache::fixed_slot_layout() const {
    if (const PolicyInfo* info = find_policy(cfg_.policy()); info && info->initial_layer_length) return false;
    for (const auto& l : layers_)
        if (pool_slots(l->policy()) > 0) return false;
    return true;
}

int64_t KVCache::min_cache_length() const {
    int64_t m = INT64_MAX;
    for (const auto& l : layers_) m = std::min(m, l->policy().cache_length());
    return m;
}

int64_t KVCache::max_forward_length() const {
    int64_t m = INT64_MAX;
    for (const auto& l : layers_) m = std::min(m, l->policy().max_forward_length());
    return m;
}

void KVCache::set_replay_logging(bool on) {
    for (auto& l : layers_) l->set_replay_logging(on);
}

void KVCache::set_step_hook(const LayerStepHook& hook) {
    for (auto& l : layers_) l->set_step_hook(hook);
}

std::vector<int32_t> chunk_ids(const Tensor& ids) {
    const std::vector<int64_t> v = ids.to_i64_vector();
    return std::vector<int32_t>(v.begin(), v.end());
}

void KVCache::set_output_projection(int layer, const Tensor& wo) {
    if (layer < 0 || layer >= num_layers()) return;
    if (auto* user = dynamic_cast<OutputProjectionUser*>(&layers_[size_t(layer)]->policy())) user->set_output_projection(wo);
}

void KVCache::reset() {
    for (auto& l : layers_) l->reset();
    for (LayerState& s : states_) s = LayerState{};
}

LayerState* KVCache::layer_state(int layer) {
    if (layer < 0 || layer >= num_layers()) throw Error(str("KV cache: layer ", layer, " out of range (", num_layers(), " layers)"));
    return stateful_[size_t(layer)] ? &states_[size_t(layer)] : nullptr;
}

size_t KVCache::state_bytes() const {
    size_t n = 0;
    for (const LayerState& s : states_) n += s.values.defined() ? s.values.nbytes() : 0;
    return n;
}

void KVCache::flush() {
    for (auto& l : layers_) l->buffer().flush();
}

void KVCache::reorder_batch(const std::vector<int32_t>& src) {
    for (auto& l : layers_) {
        if (l->policy().per_row_positions())
            throw Error(str("beam search needs a position-only cache policy (dense, lastrec, streaming); '", cfg_.name,
                            "' decides per row"));
        l->buffer().reorder_batch(src);
        if (ReordersBatch* r = l->policy().capabilities().reorders_batch) r->reorder_batch(src);
    }
    // Layer states (B, ...) follow their rows like the K/V rows do.
    for (LayerState& st : states_) {
        if (!st.values.defined()) continue;
        const int64_t B = st.values.size(0), row = st.values.numel() / B;
        const std::vector<double> v = st.values.contiguous().to_f64_vector();
        std::vector<double> out(v.size());
        for (size_t b = 0; b < src.size() && int64_t(b) < B; ++b) {
            if (src[b] < 0 || src[b] >= B) throw Error(str("reorder_batch: source row ", src[b], " outside the batch of ", B));
            std::copy_n(v.begin() + src[b] * row, row, out.begin() + int64_t(b) * row);
        }
        st.values = Tensor::from_f64(st.values.shape(), out, st.values.dtype(), {st.values.device(), MemCategory::KV_CACHE, "short-conv state"});
    }
}

void KVCache::release_buffers() {
    for (auto& l : layers_) l->buffer().release();
    for (LayerState& s : states_) s = LayerState{};
    shared_->Kw = Tensor();
    shared_->Vw = Tensor();
    shared_->owner = nullptr;
    shared_->resident = nullptr;
}

size_t KVCache::buffer_bytes() const {
    size_t n = working_bytes();
    for (const auto& l : layers_) n += l->buffer().bytes();
    return n;
}

size_t KVCache::working_bytes() const {
    return (shared_->Kw.defined() ? shared_->Kw.nbytes() : 0) + (shared_->Vw.defined() ? shared_->Vw.nbytes() : 0);
}

size_t KVCache::logical_bytes() const {
    size_t n = 0;
    for (const auto& l : layers_) n += l->logical_bytes();
    return n;
}

size_t KVCache::physical_bytes() const {
    size_t n = 0;
    for (const auto& l : layers_) n += l->buffer().bytes();
    return n;
}

double KVCache::bits_per_element() const { return layers_.empty() ? 0.0 : layers_[0]->buffer().bits_per_element(); }

}  // namespace kv
