// Size table of the ggml tensor types and names of the gguf value types. Sizes are the block
// structs of ggml-common.h (QK_K = 256 super-blocks, 32-element legacy blocks); a wrong entry
// here would mis-size every tensor, so tests check each dequantizable type against its layout.
#include "formats/gguf/gguf_types.h"

namespace kv {

const char* gguf_value_type_name(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8: return "uint8";
        case GgufValueType::INT8: return "int8";
        case GgufValueType::UINT16: return "uint16";
        case GgufValueType::INT16: return "int16";
        case GgufValueType::UINT32: return "uint32";
        case GgufValueType::INT32: return "int32";
        case GgufValueType::FLOAT32: return "float32";
        case GgufValueType::BOOL: return "bool";
        case GgufValueType::STRING: return "string";
        case GgufValueType::ARRAY: return "array";
        case GgufValueType::UINT64: return "uint64";
        case GgufValueType::INT64: return "int64";
        case GgufValueType::FLOAT64: return "float64";
        case GgufValueType::COUNT: break;
    }
    return "?";
}

size_t gguf_value_type_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL: return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16: return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32: return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64: return 8;
        case GgufValueType::STRING:
        case GgufValueType::ARRAY:
        case GgufValueType::COUNT: break;
    }
    return 0;
}

bool gguf_value_type_is_integer(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::UINT16:
        case GgufValueType::INT16:
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::UINT64:
        case GgufValueType::INT64: return true;
        default: return false;
    }
}

bool gguf_value_type_is_float(GgufValueType t) {
    return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64;
}

namespace {

using T = GgmlType;
// {type, name, elements per block, bytes per block, dequantizable}
constexpr GgmlTypeTraits kTraits[] = {
    {T::F32, "F32", 1, 4, true},
    {T::F16, "F16", 1, 2, true},
    {T::Q4_0, "Q4_0", 32, 18, true},     // f16 d + 16 bytes of nibbles
    {T::Q4_1, "Q4_1", 32, 20, true},     // f16 d, m + 16
    {T::Q5_0, "Q5_0", 32, 22, true},     // f16 d + 4 (high bits) + 16
    {T::Q5_1, "Q5_1", 32, 24, true},     // f16 d, m + 4 + 16
    {T::Q8_0, "Q8_0", 32, 34, true},     // f16 d + 32 int8
    {T::Q8_1, "Q8_1", 32, 36, false},    // f16 d, s + 32 int8
    {T::Q2_K, "Q2_K", 256, 84, false},   // 16 scales + 64 quants + 2 f16
    {T::Q3_K, "Q3_K", 256, 110, false},  // 32 hmask + 64 quants + 12 scales + f16
    {T::Q4_K, "Q4_K", 256, 144, true},   // 2 f16 + 12 scales + 128 quants
    {T::Q5_K, "Q5_K", 256, 176, true},   // 2 f16 + 12 scales + 32 high bits + 128 quants
    {T::Q6_K, "Q6_K", 256, 210, true},   // 128 low + 64 high + 16 int8 scales + f16
    {T::Q8_K, "Q8_K", 256, 292, false},  // f32 d + 256 int8 + 16 int16 sums
    {T::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    {T::IQ2_XS, "IQ2_XS", 256, 74, false},
    {T::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    {T::IQ1_S, "IQ1_S", 256, 50, false},
    {T::IQ4_NL, "IQ4_NL", 32, 18, false},
    {T::IQ3_S, "IQ3_S", 256, 110, false},
    {T::IQ2_S, "IQ2_S", 256, 82, false},
    {T::IQ4_XS, "IQ4_XS", 256, 136, false},
    {T::I8, "I8", 1, 1, false},
    {T::I16, "I16", 1, 2, false},
    {T::I32, "I32", 1, 4, false},
    {T::I64, "I64", 1, 8, false},
    {T::F64, "F64", 1, 8, false},
    {T::IQ1_M, "IQ1_M", 256, 56, false},
    {T::BF16, "BF16", 1, 2, true},
    {T::TQ1_0, "TQ1_0", 256, 54, false},
    {T::TQ2_0, "TQ2_0", 256, 66, false},
    {T::MXFP4, "MXFP4", 32, 17, true},  // E8M0 scale + 16 bytes of E2M1 nibbles
    {T::NVFP4, "NVFP4", 64, 36, false},
    {T::Q1_0, "Q1_0", 128, 18, false},
    {T::Q2_0, "Q2_0", 64, 18, false},
};

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t id) {
    for (const GgmlTypeTraits& t : kTraits)
        if (uint32_t(t.type) == id) return &t;
    return nullptr;
}

const GgmlTypeTraits& ggml_type_info(GgmlType t) {
    const GgmlTypeTraits* p = ggml_type_traits(uint32_t(t));
    return p ? *p : kTraits[0];  // unreachable for enum values; keeps callers crash-free
}

const char* ggml_type_name(GgmlType t) {
    const GgmlTypeTraits* p = ggml_type_traits(uint32_t(t));
    return p ? p->name : "?";
}

std::string ggml_dequantizable_type_list() {
    // Fixed order: plain floats first, then legacy blocks, then k-quants, then microscaling.
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4";
}

}  // namespace kv
