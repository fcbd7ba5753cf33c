// Buffer factory: the buffer half of "{policy}-{buffer}" plus placement options.
#include "engine/kv/buffers/buffer_common.h"

namespace kv {

std::unique_ptr<KVBuffer> make_buffer(const KVCacheConfig& cfg, const BufferParams& p, std::shared_ptr<BufferShared> shared) {
    const std::string b = cfg.buffer();
    const BufferInfo* info = find_buffer(b);  // never null: cache_name() reads known buffers only
    std::unique_ptr<KVBuffer> out;
    const DType dt = info->dtype.value_or(p.act_dtype);
    const bool quantized = info->kind == BufferKind::QUANTIZED;
    if (p.values_are_keys && (info->kind != BufferKind::FULL || cfg.paged_block_size > 0 || cfg.cpu_offload))
        throw Error(str("--kv_cache.name: the latent cache of multi-head latent attention (--model.mla_cache latent) is stored by the "
                        "full-precision buffers (default, f32, bf16, f16) without paging or offload; '", b, "'",
                        cfg.paged_block_size > 0 ? " paged" : cfg.cpu_offload ? " offloaded" : "",
                        " is not one; expected such a buffer or --model.mla_cache expanded"));
    if (info->kind == BufferKind::KIVI) {
        if (cfg.paged_block_size > 0)  // why: docs/PERFORMANCE.md "KIVI decode", placements
            throw Error(str("--kv_cache.paged_block_size: the '", b, "' buffer is not paged (its packed groups are its blocks)"));
        out = make_kivi_buffer(cfg, p, info->bits);
        if (cfg.cpu_offload) out = make_offload_buffer(std::move(out), p, shared);
        return out;
    }
    if (info->kind == BufferKind::THINK) {
        if (cfg.paged_block_size > 0 || cfg.cpu_offload)  // validate_kv_config says so first
            throw Error(str("--kv_cache.name: the '", b, "' buffer is neither paged nor offloaded"));
        return make_think_buffer(cfg, p);
    }
    if (quantized) {
        if (cfg.paged_block_size > 0)
            throw Error(str("--kv_cache.paged_block_size: paged storage is for full-precision buffers; '", b, "' is quantized"));
        const auto [kf, vf] = kv_quant_formats(cfg);
        out = make_quantized_buffer(cfg, p, kf, vf, info->name, shared);
    } else if (cfg.paged_block_size > 0) {
        out = make_paged_buffer(p, dt, cfg.paged_block_size, cfg.compact);
    } else {
        out = make_default_buffer(p, dt);
    }
    if (cfg.cpu_offload) out = make_offload_buffer(std::move(out), p, shared);
    return out;
}

}  // namespace kv
