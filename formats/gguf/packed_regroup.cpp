// Packed weights regrouped in place (see packed_regroup.h).
#include "formats/gguf/packed_regroup.h"

#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "kernels/common/packed_blocks.h"

namespace kv {

Tensor regroup_q4_1_rows(const Tensor& w) {
    namespace B = gguf_blocks;
    constexpr int64_t kBlock = 20;  // bytes of one Q4_1 block
    if (w.dtype() != DType::U8 || w.ndim() != 3 || w.size(2) != kBlock || !w.device().is_cpu() || !w.is_contiguous() ||
        w.size(0) % B::kQ41Rows != 0)
        throw Error(str("packed weight: ", w.describe(), " is not a contiguous host Q4_1 weight [rows, blocks, 20] with a multiple of 16 rows"));
    // Rows 16g .. 16g + 15 occupy the same bytes in both layouts: one group at a time through a
    // small copy.
    const int64_t nb = w.size(1), group = B::kQ41Rows * nb * kBlock;
    uint8_t* base = static_cast<uint8_t*>(w.data_ptr());
    std::vector<uint8_t> tmp(static_cast<size_t>(group));
    for (int64_t g = 0; g < w.size(0) / B::kQ41Rows; ++g) {
        uint8_t* p = base + g * group;
        std::memcpy(tmp.data(), p, size_t(group));
        B::q4_1_r16_from_rows(tmp.data(), nb, p);
    }
    return w.as_strided({w.size(0) / B::kQ41Rows, nb, B::kQ41GroupBytes}, {nb * B::kQ41GroupBytes, B::kQ41GroupBytes, 1}, w.offset());
}

}  // namespace kv
