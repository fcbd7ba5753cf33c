// Buffer factory: the buffer half of "{policy}-{buffer}" plus placement options.
#include "buffer_common.h"

namespace kv {

std::unique_ptr<KVBuffer> make_buffer(const KVCacheConfig& cfg, const BufferParams& p, std::shared_ptr<BufferShared> shared) {
    const std::string b = cfg.buffer();
    std::unique_ptr<KVBuffer> out;
    DType dt = b == "f32" ? DType::F32 : b == "bf16" ? DType::BF16 : b == "f16" ? DType::F16 : p.act_dtype;
    const bool quantized = b == "q8" || b == "q4" || b == "nf4" || b == "q8_0" || b == "q4_0";
    if (b == "kivi2" || b == "kivi4") {
        if (cfg.paged_block_size > 0)  // why: docs/PERFORMANCE.md "KIVI decode", placements
            throw Error(str("--kv_cache.paged_block_size: the '", b, "' buffer is not paged (its packed groups are its blocks)"));
        out = make_kivi_buffer(cfg, p, b == "kivi2" ? 2 : 4);
        if (cfg.cpu_offload) out = make_offload_buffer(std::move(out), p, shared);
        return out;
    }
    if (quantized) {
        if (cfg.paged_block_size > 0)
            throw Error(str("--kv_cache.paged_block_size: paged storage is for full-precision buffers; '", b, "' is quantized"));
        out = make_quantized_buffer(cfg, p, ops::quant_format_from_name(b), shared);
    } else if (cfg.paged_block_size > 0) {
        out = make_paged_buffer(p, dt, cfg.paged_block_size);
    } else {
        out = make_default_buffer(p, dt);
    }
    if (cfg.cpu_offload) out = make_offload_buffer(std::move(out), p, shared);
    return out;
}

}  // namespace kv
