// Safetensors dtype tables (see safetensors_dtype.h). The name list must stay in StDType order.
#include "formats/io/safetensors_dtype.h"

#include "engine/core/error.h"

namespace kv {

namespace {
struct StDTypeInfo {
    const char* name;
    int bits;
};
constexpr StDTypeInfo kInfo[] = {
    {"BOOL", 8},         {"F4", 4},           {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},
    {"F8_E5M2", 8},      {"F8_E4M3", 8},      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},         {"F8_E5M2FNUZ", 8},
    {"I16", 16},         {"U16", 16},         {"F16", 16},    {"BF16", 16},   {"I32", 32}, {"U32", 32},
    {"F32", 32},         {"C64", 64},         {"F64", 64},    {"I64", 64},    {"U64", 64},
};
static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == size_t(StDType::COUNT), "dtype table must match StDType");
}  // namespace

const char* st_dtype_name(StDType t) { return t < StDType::COUNT ? kInfo[size_t(t)].name : "?"; }

int st_dtype_bits(StDType t) { return t < StDType::COUNT ? kInfo[size_t(t)].bits : 0; }

std::optional<StDType> st_dtype_from_name(const std::string& name) {
    for (size_t i = 0; i < size_t(StDType::COUNT); ++i)
        if (name == kInfo[i].name) return StDType(i);
    return std::nullopt;
}

std::optional<DType> st_dtype_to_kv(StDType t) {
    switch (t) {
        case StDType::F32: return DType::F32;
        case StDType::F64: return DType::F64;
        case StDType::F16: return DType::F16;
        case StDType::BF16: return DType::BF16;
        case StDType::I32: return DType::I32;
        case StDType::I64: return DType::I64;
        case StDType::U8: return DType::U8;
        case StDType::BOOL: return DType::U8;
        default: return std::nullopt;
    }
}

StDType st_dtype_from_kv(DType t) {
    switch (t) {
        case DType::F32: return StDType::F32;
        case DType::F64: return StDType::F64;
        case DType::F16: return StDType::F16;
        case DType::BF16: return StDType::BF16;
        case DType::I32: return StDType::I32;
        case DType::I64: return StDType::I64;
        case DType::U8: return StDType::U8;
        default: break;
    }
    throw Error(str("dtype ", int(t), " has no safetensors equivalent"));
}

const char* st_loadable_dtypes() { return "F32, F16, BF16, F64, I32, I64, U8, BOOL (read as U8)"; }

}  // namespace kv
