// Drives the block functions of gguf_blocks.h over rows and threads, and converts to bf16.
// bf16 output goes through f32 (one block at a time on the stack), so bf16 values are exactly
// the round-to-nearest-even of the f32 values.
#include "formats/gguf/gguf_dequant.h"

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"
#include "formats/gguf/gguf_blocks.h"

namespace kv {

namespace {

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType t) {
    namespace B = gguf_blocks;
    switch (t) {
        case GgmlType::Q8_0: return B::dequant_q8_0;
        case GgmlType::Q4_0: return B::dequant_q4_0;
        case GgmlType::Q4_1: return B::dequant_q4_1;
        case GgmlType::Q5_0: return B::dequant_q5_0;
        case GgmlType::Q5_1: return B::dequant_q5_1;
        case GgmlType::Q4_K: return B::dequant_q4_k;
        case GgmlType::Q5_K: return B::dequant_q5_k;
        case GgmlType::Q6_K: return B::dequant_q6_k;
        // ggml's block_mxfp4 is the layout of kvlab's mxfp4 KV format (E8M0 byte, then element j
        // in the low nibble and j + 16 in the high); ggml's doubled E2M1 table times 2^(e - 128)
        // is the OCP value e2m1 times 2^(e - 127).
        case GgmlType::MXFP4: return dequantize_block_mxfp4;
        default: return nullptr;
    }
}

void check(GgmlType t, int64_t n, const std::string& what) {
    const GgmlTypeTraits& tr = ggml_type_info(t);
    if (!gguf_can_dequantize(t))
        throw Error(str(what, ": ggml type ", tr.name, " cannot be dequantized by kvlab; supported types: ",
                        ggml_dequantizable_type_list()));
    if (n < 0 || n % tr.block_size != 0)
        throw Error(str(what, ": ", n, " elements of type ", tr.name, " are not whole blocks of ", tr.block_size));
}

// Plain element types and blocks, to f32. Assumes check() passed.
void to_f32(GgmlType t, const uint8_t* src, int64_t n, float* dst) {
    switch (t) {
        case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(uint16_t(src[2 * i] | src[2 * i + 1] << 8));
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(uint16_t(src[2 * i] | src[2 * i + 1] << 8));
            return;
        default: break;
    }
    const GgmlTypeTraits& tr = ggml_type_info(t);
    BlockFn fn = block_fn(t);
    for (int64_t b = 0; b < n / tr.block_size; ++b) fn(src + b * tr.type_size, dst + b * tr.block_size);
}

void to_bf16(GgmlType t, const uint8_t* src, int64_t n, uint16_t* dst) {
    if (t == GgmlType::BF16) {
        std::memcpy(dst, src, size_t(n) * 2);
        return;
    }
    float buf[gguf_blocks::QK_K];
    const int64_t step = gguf_blocks::QK_K;  // a multiple of every block size we handle
    const int64_t bytes_per_elem_block = ggml_type_info(t).type_size;
    const int64_t block = ggml_type_info(t).block_size;
    for (int64_t i = 0; i < n; i += step) {
        const int64_t m = n - i < step ? n - i : step;
        to_f32(t, src + (i / block) * bytes_per_elem_block, m, buf);
        for (int64_t k = 0; k < m; ++k) dst[i + k] = f32_to_bf16(buf[k]);
    }
}

}  // namespace

bool gguf_can_dequantize(GgmlType t) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
    return tr && tr->dequantizable;
}

uint64_t gguf_bytes_for(GgmlType t, int64_t n) {
    const GgmlTypeTraits& tr = ggml_type_info(t);
    return uint64_t(n / tr.block_size) * uint64_t(tr.type_size);
}

void gguf_dequantize_f32(GgmlType t, const uint8_t* src, int64_t n, float* dst, const std::string& what) {
    check(t, n, what);
    to_f32(t, src, n, dst);
}

void gguf_dequantize_bf16(GgmlType t, const uint8_t* src, int64_t n, uint16_t* dst, const std::string& what) {
    check(t, n, what);
    to_bf16(t, src, n, dst);
}

void gguf_check_dequantizable(GgmlType t, int64_t row_len, DType out, const std::string& what) {
    check(t, row_len, what);
    if (out != DType::F32 && out != DType::BF16)
        throw Error(str(what, ": dequantization writes f32 or bf16, not dtype ", int(out)));
}

void gguf_dequantize_row_range(GgmlType t, const uint8_t* src, int64_t r0, int64_t r1, int64_t row_len, DType out,
                               void* dst, const int64_t* row_map) {
    const int64_t src_row_bytes = int64_t(gguf_bytes_for(t, row_len));
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t d = row_map ? row_map[r] : r;
        const uint8_t* s = src + r * src_row_bytes;
        if (out == DType::F32)
            to_f32(t, s, row_len, static_cast<float*>(dst) + d * row_len);
        else
            to_bf16(t, s, row_len, static_cast<uint16_t*>(dst) + d * row_len);
    }
}

void gguf_dequantize_rows(GgmlType t, const uint8_t* src, int64_t n_rows, int64_t row_len, DType out, void* dst,
                          const int64_t* row_map, const std::string& what) {
    gguf_check_dequantizable(t, row_len, out, what);
    if (n_rows < 0) throw Error(str(what, ": negative row count ", n_rows));
    // Chunks of ~64K elements handed out dynamically: on a shared machine a static split waits
    // for whichever thread the OS parks. Below ~4M elements (a few ms on one core) one thread
    // does it all: waking a team on a busy machine costs a scheduler tick per call.
    const int64_t chunk = row_len > 0 ? std::max<int64_t>(1, (int64_t(1) << 16) / row_len) : n_rows + 1;
    const int64_t n_chunks = (n_rows + chunk - 1) / chunk;
    const bool parallel = n_chunks > 1 && n_rows * row_len >= (int64_t(1) << 22);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t c = 0; c < n_chunks; ++c)
        gguf_dequantize_row_range(t, src, c * chunk, std::min(n_rows, (c + 1) * chunk), row_len, out, dst, row_map);
}

}  // namespace kv
