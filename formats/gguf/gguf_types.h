// The two enumerations of the GGUF container: metadata value types (gguf) and tensor element
// types (ggml), with the size table every size check uses. Ids and sizes follow ggml's
// docs/gguf.md and ggml-common.h. Pure data: no I/O, no tensors, no dequantization here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kv {

// ---- metadata value types (uint32 on disk) -----------------------------------------------
enum class GgufValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,  // one byte, 0 or 1; anything else is invalid
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
    COUNT = 13
};

// "uint8", ..., "array"; "?" for ids outside the enum.
const char* gguf_value_type_name(GgufValueType t);
// Bytes of one fixed-size scalar; 0 for STRING and ARRAY (variable size).
size_t gguf_value_type_size(GgufValueType t);
bool gguf_value_type_is_integer(GgufValueType t);  // UINT8..INT64 (not BOOL)
bool gguf_value_type_is_float(GgufValueType t);    // FLOAT32, FLOAT64

// ---- tensor element types (uint32 on disk) -----------------------------------------------
// Ids 4, 5 (old Q4_2/Q4_3) and 31..33, 36..38 (repacked layouts) were removed from the format;
// files carrying them are rejected like any unknown id.
enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
};

struct GgmlTypeTraits {
    GgmlType type;
    const char* name;    // "Q4_K"
    int64_t block_size;  // elements per block (1 for plain types)
    int64_t type_size;   // bytes per block
    bool dequantizable;  // kvlab converts it to f32/bf16 (gguf_dequant.h)
};

// Traits of a ggml type id as read from a file; nullptr when the id is unknown or removed.
const GgmlTypeTraits* ggml_type_traits(uint32_t id);
// Traits of a known type (never nullptr).
const GgmlTypeTraits& ggml_type_info(GgmlType t);
const char* ggml_type_name(GgmlType t);
// "F32, F16, BF16, Q8_0, ..." — the types kvlab dequantizes, for error messages.
std::string ggml_dequantizable_type_list();

}  // namespace kv
