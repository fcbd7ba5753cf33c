// The safetensors element types: names, bit widths, the order the reference writer sorts by,
// and the mapping to kv::DType. Pure tables — no files, no tensors (the fuzz target links it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/common/dtype.h"

namespace kv {

// Declared in the reference implementation's order (safetensors `Dtype`, "increasing
// alignment"); the writer sorts tensors by this order, descending, then by name.
enum class StDType : uint8_t {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
    COUNT
};

const char* st_dtype_name(StDType t);                     // "BF16"
std::optional<StDType> st_dtype_from_name(const std::string& name);  // exact, case-sensitive
int st_dtype_bits(StDType t);                             // 4, 6, 8, 16, 32 or 64

// kvlab's element type for a file dtype; nullopt when DType has no exact equivalent
// (BOOL is read as U8: one byte, 0 or 1).
std::optional<DType> st_dtype_to_kv(StDType t);
StDType st_dtype_from_kv(DType t);  // throws kv::Error for DType::COUNT

// "F32, F16, BF16, F64, I32, I64, U8, BOOL (read as U8)" — for messages.
const char* st_loadable_dtypes();

}  // namespace kv
