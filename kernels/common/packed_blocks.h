// ggml block formats: the one definition of each layout and its dequantization to f32, shared
// by the GGUF loader (formats/gguf), the packed-weight matmul kernels (kernels/cpu/packed_matmul.cpp)
// and the tests. One small function per format turns one block into its 32 or 256 floats.
// Layout facts come from ggml-common.h / ggml-quants.c (read for facts, not copied). No loops
// over tensors, no threads, no I/O here.
//
// Rounding contract: every multiply/add below is one f32 operation in the order written, and
// the files that call these are compiled with -ffp-contract=off (kvlab_gguf; packed_matmul.cpp),
// so no FMA contraction: a packed weight read by a kernel has exactly the value the loader's
// dequantize-at-load path stores. An independent reader (tools/reference/) gets bit-identical
// values when it evaluates the same formulas in float32 in the same order. f16 fields are
// little-endian IEEE binary16, converted exactly.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/quant_formats.h"

namespace kv::gguf_blocks {

constexpr int QK = 32;    // elements per legacy block (Q4_0 ... Q8_0)
constexpr int QK_K = 256;  // elements per k-quant super-block

inline float half_at(const uint8_t* p) { return f16_to_f32(uint16_t(uint16_t(p[0]) | uint16_t(p[1]) << 8)); }

// ---- Q8_0: 32 elements in 34 bytes --------------------------------------------------------
// [0,2) d f16 | [2,34) qs[32] int8.  x[j] = qs[j] * d
// Q8_0 and Q4_0 are also KV buffer formats: their one definition is kernels/common/quant_formats.h.
inline void dequant_q8_0(const uint8_t* b, float* y) { dequantize_block_q8_0(b, y); }

// ---- F16 / BF16 kept as stored: 32 f16 in 64 bytes, 64 bf16 in 128 bytes (little-endian) ---
// Exact conversions, as the loader's dequantize-at-load path.
inline void dequant_f16(const uint8_t* b, float* y) {
    for (int i = 0; i < 32; ++i) y[i] = f16_to_f32(uint16_t(b[2 * i] | (b[2 * i + 1] << 8)));
}
inline void dequant_bf16(const uint8_t* b, float* y) {
    for (int i = 0; i < 64; ++i) y[i] = bf16_to_f32(uint16_t(b[2 * i] | (b[2 * i + 1] << 8)));
}

// ---- Q4_0: 32 elements in 18 bytes --------------------------------------------------------
// [0,2) d f16 | [2,18) qs[16]: byte j = element j in the low nibble, element j+16 in the high.
// x = (q - 8) * d
inline void dequant_q4_0(const uint8_t* b, float* y) { dequantize_block_q4_0(b, y); }

// ---- Q4_1: 32 elements in 20 bytes --------------------------------------------------------
// [0,2) d f16 | [2,4) m f16 | [4,20) qs[16] nibbles as Q4_0.  x = q * d + m
inline void dequant_q4_1(const uint8_t* b, float* y) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < QK / 2; ++j) {
        y[j] = float(qs[j] & 15) * d + m;
        y[j + QK / 2] = float(qs[j] >> 4) * d + m;
    }
}

// ---- Q4_1 in row groups of 16 (kvlab's own layout, not a ggml type): 16 rows x 32 in 320 bytes
// The same bytes as the 16 rows' Q4_1 blocks at one column block, regrouped so that a vector
// of 8 lanes holds one column of 8 rows (the CPU decode GEMV, packed_matmul.cpp). Two 160-byte
// halves, rows 0..7 then 8..15, each: [0,16) d of its 8 rows (f16) | [16,32) m of its 8 rows |
// [32,160) quant byte j of its row r at 32 + 8j + r (byte j holds elements j and j + 16, as in
// Q4_1). Rows 16g .. 16g + 15 of a Q4_1 matrix occupy the same bytes in both layouts, so a
// matrix is regrouped in place; the two halves side by side keep one address stream.
constexpr int kQ41Rows = 16, kQ41GroupBytes = 320;  // a block
constexpr int kQ41HalfRows = 8, kQ41HalfBytes = 160;  // one half of it
// Row r's Q4_1 block (20 bytes) from a group block: the original bytes exactly.
inline void q4_1_r16_row_block(const uint8_t* g, int r, uint8_t* b) {
    const uint8_t* h = g + (r / kQ41HalfRows) * kQ41HalfBytes;
    r %= kQ41HalfRows;
    b[0] = h[2 * r], b[1] = h[2 * r + 1], b[2] = h[16 + 2 * r], b[3] = h[16 + 2 * r + 1];
    for (int j = 0; j < QK / 2; ++j) b[4 + j] = h[32 + 8 * j + r];
}
// The group block of 16 rows' Q4_1 blocks (rows[r]: row r's block).
inline void q4_1_r16_group_block(const uint8_t* const rows[16], uint8_t* g) {
    for (int r = 0; r < kQ41Rows; ++r) {
        const uint8_t* b = rows[r];
        uint8_t* h = g + (r / kQ41HalfRows) * kQ41HalfBytes;
        const int i = r % kQ41HalfRows;
        h[2 * i] = b[0], h[2 * i + 1] = b[1], h[16 + 2 * i] = b[2], h[16 + 2 * i + 1] = b[3];
        for (int j = 0; j < QK / 2; ++j) h[32 + 8 * j + i] = b[4 + j];
    }
}
// 16 consecutive Q4_1 rows of nb blocks each (the file's layout) as their nb group blocks.
inline void q4_1_r16_from_rows(const uint8_t* rows, int64_t nb, uint8_t* out) {
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* r16[kQ41Rows];
        for (int r = 0; r < kQ41Rows; ++r) r16[r] = rows + (r * nb + b) * 20;
        q4_1_r16_group_block(r16, out + b * kQ41GroupBytes);
    }
}
// A whole Q4_1 matrix of `rows` rows (a multiple of 16), nb blocks each, regrouped into out.
inline void q4_1_r16_from_matrix(const uint8_t* q41, int64_t rows, int64_t nb, uint8_t* out) {
    for (int64_t g = 0; g < rows / kQ41Rows; ++g) q4_1_r16_from_rows(q41 + g * kQ41Rows * nb * 20, nb, out + g * nb * kQ41GroupBytes);
}
// The 16 x 32 values of a group block, row-major: bit for bit dequant_q4_1 of each row's block.
inline void dequant_q4_1_r16(const uint8_t* g, float* y) {
    uint8_t b[20];
    for (int r = 0; r < kQ41Rows; ++r) {
        q4_1_r16_row_block(g, r, b);
        dequant_q4_1(b, y + r * QK);
    }
}

// ---- Q5_0: 32 elements in 22 bytes --------------------------------------------------------
// [0,2) d f16 | [2,6) qh: u32 little-endian, bit j = 5th bit of element j (j = 0..31)
// | [6,22) qs[16] low 4 bits, nibbles as Q4_0.  q = low | bit << 4,  x = (q - 16) * d
inline void dequant_q5_0(const uint8_t* b, float* y) {
    const float d = half_at(b);
    const uint32_t qh = uint32_t(b[2]) | uint32_t(b[3]) << 8 | uint32_t(b[4]) << 16 | uint32_t(b[5]) << 24;
    const uint8_t* qs = b + 6;
    for (int j = 0; j < QK / 2; ++j) {
        const int q0 = int((qs[j] & 15) | ((qh >> j) & 1) << 4);
        const int q1 = int((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        y[j] = float(q0 - 16) * d;
        y[j + QK / 2] = float(q1 - 16) * d;
    }
}

// ---- Q5_1: 32 elements in 24 bytes --------------------------------------------------------
// [0,2) d f16 | [2,4) m f16 | [4,8) qh as Q5_0 | [8,24) qs[16].  x = q * d + m
inline void dequant_q5_1(const uint8_t* b, float* y) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint32_t qh = uint32_t(b[4]) | uint32_t(b[5]) << 8 | uint32_t(b[6]) << 16 | uint32_t(b[7]) << 24;
    const uint8_t* qs = b + 8;
    for (int j = 0; j < QK / 2; ++j) {
        const int q0 = int((qs[j] & 15) | ((qh >> j) & 1) << 4);
        const int q1 = int((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
        y[j] = float(q0) * d + m;
        y[j + QK / 2] = float(q1) * d + m;
    }
}

// ---- k-quant 6-bit scales and mins (Q4_K, Q5_K) -------------------------------------------
// 12 bytes hold eight 6-bit scales sc[0..7] and eight 6-bit mins mn[0..7], one per 32-element
// sub-block:  j < 4: sc = s[j] & 63,  mn = s[j+4] & 63
//             j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,  mn = (s[j+4] >> 4) | (s[j] >> 6) << 4
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

// ---- Q4_K: 256 elements in 144 bytes ------------------------------------------------------
// [0,2) d f16 | [2,4) dmin f16 | [4,16) scales (k_scale_min) | [16,144) qs[128].
// Group g = 0..3 covers elements [64g, 64g+64): qs[32g + l] holds element 64g + l in its low
// nibble (sub-block 2g) and element 64g + 32 + l in its high nibble (sub-block 2g+1).
// x = (d * sc[s]) * q - (dmin * mn[s])
inline void dequant_q4_k(const uint8_t* b, float* y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* sc6 = b + 4;
    const uint8_t* qs = b + 16;
    for (int g = 0; g < 4; ++g) {
        int sc0, mn0, sc1, mn1;
        k_scale_min(sc6, 2 * g, sc0, mn0);
        k_scale_min(sc6, 2 * g + 1, sc1, mn1);
        const float d0 = d * float(sc0), m0 = dmin * float(mn0);
        const float d1 = d * float(sc1), m1 = dmin * float(mn1);
        const uint8_t* q = qs + 32 * g;
        float* out = y + 64 * g;
        for (int l = 0; l < 32; ++l) {
            out[l] = d0 * float(q[l] & 15) - m0;
            out[l + 32] = d1 * float(q[l] >> 4) - m1;
        }
    }
}

// ---- Q5_K: 256 elements in 176 bytes ------------------------------------------------------
// [0,2) d f16 | [2,4) dmin f16 | [4,16) scales (k_scale_min) | [16,48) qh[32] | [48,176) qs[128].
// Low nibbles as Q4_K; the 5th bit of element 64g + l is bit 2g of qh[l], of element
// 64g + 32 + l bit 2g+1 of qh[l].  q = low | bit << 4,  x = (d * sc[s]) * q - (dmin * mn[s])
inline void dequant_q5_k(const uint8_t* b, float* y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t* sc6 = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + 48;
    for (int g = 0; g < 4; ++g) {
        int sc0, mn0, sc1, mn1;
        k_scale_min(sc6, 2 * g, sc0, mn0);
        k_scale_min(sc6, 2 * g + 1, sc1, mn1);
        const float d0 = d * float(sc0), m0 = dmin * float(mn0);
        const float d1 = d * float(sc1), m1 = dmin * float(mn1);
        const uint8_t* q = qs + 32 * g;
        float* out = y + 64 * g;
        for (int l = 0; l < 32; ++l) {
            const int q0 = (q[l] & 15) | ((qh[l] >> (2 * g)) & 1) << 4;
            const int q1 = (q[l] >> 4) | ((qh[l] >> (2 * g + 1)) & 1) << 4;
            out[l] = d0 * float(q0) - m0;
            out[l + 32] = d1 * float(q1) - m1;
        }
    }
}

// ---- Q6_K: 256 elements in 210 bytes ------------------------------------------------------
// [0,128) ql (low 4 bits) | [128,192) qh (high 2 bits) | [192,208) scales[16] int8 | [208,210) d f16.
// Element e = 128h + 32k + l (h = 0..1, k = 0..3, l = 0..31):
//   low  = (ql[64h + 32(k & 1) + l] >> 4(k >> 1)) & 15
//   high = (qh[32h + l] >> 2k) & 3
//   q = (low | high << 4) - 32,  scale = scales[8h + 2k + l / 16]
//   x = (d * scale) * q
inline void dequant_q6_k(const uint8_t* b, float* y) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = half_at(b + 208);
    for (int h = 0; h < 2; ++h) {
        const uint8_t* l4 = ql + 64 * h;
        const uint8_t* h2 = qh + 32 * h;
        const int8_t* s = sc + 8 * h;
        float* out = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q0 = int((l4[l] & 15) | ((h2[l] >> 0) & 3) << 4) - 32;
            const int q1 = int((l4[l + 32] & 15) | ((h2[l] >> 2) & 3) << 4) - 32;
            const int q2 = int((l4[l] >> 4) | ((h2[l] >> 4) & 3) << 4) - 32;
            const int q3 = int((l4[l + 32] >> 4) | ((h2[l] >> 6) & 3) << 4) - 32;
            out[l] = d * float(s[is + 0]) * float(q0);
            out[l + 32] = d * float(s[is + 2]) * float(q1);
            out[l + 64] = d * float(s[is + 4]) * float(q2);
            out[l + 96] = d * float(s[is + 6]) * float(q3);
        }
    }
}

}  // namespace kv::gguf_blocks

namespace kv {

// Block formats a packed weight (MATMUL with a u8 weight, op.h) can have. Values are kvlab's
// own (not ggml type ids); 0 means "not packed".
// NF4 is bitsandbytes' format (quant_formats.h: 64 values, 32 bytes of nibbles, then the f32
// absmax), the packed base of a QLoRA run. F16 and BF16 are GGUF's half-precision tensors kept
// as stored: a "block" is just 32 f16 (64 bytes) or 64 bf16 (128 bytes) values in row order —
// the two sizes differ only so that the block size in bytes names the format. Every other
// format is a ggml block. Q4_1_R16 is Q4_1 regrouped by 16 rows (gguf_blocks::dequant_q4_1_r16):
// its block covers 16 rows x 32 columns, so its tensors are [rows / 16, blocks per row, 320].
enum class PackedFormat : uint8_t { NONE = 0, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, NF4, F16, BF16, Q4_1_R16, COUNT };

KV_HD constexpr int packed_block_elems(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0:
        case PackedFormat::Q4_0:
        case PackedFormat::Q4_1:
        case PackedFormat::Q5_0:
        case PackedFormat::Q5_1:
        case PackedFormat::F16: return 32;
        case PackedFormat::Q4_K:
        case PackedFormat::Q5_K:
        case PackedFormat::Q6_K: return 256;
        case PackedFormat::NF4:
        case PackedFormat::BF16: return 64;
        case PackedFormat::Q4_1_R16: return 512;
        default: return 0;
    }
}

// Weight rows one block covers: 16 for the row-grouped layout, 1 for every ggml format.
KV_HD constexpr int packed_block_rows(PackedFormat f) { return f == PackedFormat::Q4_1_R16 ? 16 : 1; }
// Columns (input elements) one block covers.
KV_HD constexpr int packed_block_cols(PackedFormat f) { return packed_block_elems(f) / packed_block_rows(f); }

KV_HD constexpr int packed_block_bytes(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return 34;
        case PackedFormat::Q4_0: return 18;
        case PackedFormat::Q4_1: return 20;
        case PackedFormat::Q5_0: return 22;
        case PackedFormat::Q5_1: return 24;
        case PackedFormat::Q4_K: return 144;
        case PackedFormat::Q5_K: return 176;
        case PackedFormat::Q6_K: return 210;
        case PackedFormat::NF4: return 36;
        case PackedFormat::F16: return 64;
        case PackedFormat::BF16: return 128;
        case PackedFormat::Q4_1_R16: return 320;
        default: return 0;
    }
}

inline const char* packed_format_name(PackedFormat f) {
    static const char* const names[] = {"none", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "NF4", "F16", "BF16", "Q4_1x16"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(PackedFormat::COUNT), "packed format names out of date");
    return size_t(f) < size_t(PackedFormat::COUNT) ? names[size_t(f)] : "?";
}

// Bytes of one packed row of k elements (k a multiple of the block's columns); for a
// row-grouped format, of one group of packed_block_rows(f) rows.
KV_HD int64_t packed_row_bytes(PackedFormat f, int64_t k) {
    const int bc = packed_block_cols(f);
    return bc > 0 ? k / bc * packed_block_bytes(f) : 0;
}

// The format a packed row of k elements stored in row_bytes bytes has, from a format id;
// NONE when the id is unknown or the sizes do not fit it.
KV_HD PackedFormat packed_format_checked(int id, int64_t k, int64_t row_bytes) {
    if (id <= 0 || id >= int(PackedFormat::COUNT)) return PackedFormat::NONE;
    const PackedFormat f = PackedFormat(id);
    const int bc = packed_block_cols(f);
    if (k <= 0 || k % bc != 0 || packed_row_bytes(f, k) != row_bytes) return PackedFormat::NONE;
    return f;
}

// One block of format f (packed_block_elems(f) values; row-major rows x cols) to f32.
inline void packed_dequant_block(PackedFormat f, const uint8_t* b, float* y) {
    namespace B = gguf_blocks;
    switch (f) {
        case PackedFormat::Q8_0: B::dequant_q8_0(b, y); break;
        case PackedFormat::Q4_0: B::dequant_q4_0(b, y); break;
        case PackedFormat::Q4_1: B::dequant_q4_1(b, y); break;
        case PackedFormat::Q5_0: B::dequant_q5_0(b, y); break;
        case PackedFormat::Q5_1: B::dequant_q5_1(b, y); break;
        case PackedFormat::Q4_K: B::dequant_q4_k(b, y); break;
        case PackedFormat::Q5_K: B::dequant_q5_k(b, y); break;
        case PackedFormat::Q6_K: B::dequant_q6_k(b, y); break;
        case PackedFormat::NF4: dequantize_block_nf4(b, 64, y); break;
        case PackedFormat::F16: B::dequant_f16(b, y); break;
        case PackedFormat::BF16: B::dequant_bf16(b, y); break;
        case PackedFormat::Q4_1_R16: B::dequant_q4_1_r16(b, y); break;
        default: break;
    }
}

}  // namespace kv
