// Weight sanity at load (see weight_check.h).
#include "engine/core/weight_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/error.h"

namespace kv {

namespace {
// Index of the first element whose magnitude bits exceed `limit` (NaN and Inf have the largest
// magnitude bits of all), or n. Scans in blocks so the inner loop has no early exit and
// vectorises; only a block with a hit is searched element by element.
template <typename U>
int64_t first_above(const U* p, int64_t n, U mask, U limit) {
    constexpr int64_t kBlock = 4096;
    for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t e = std::min(n, b + kBlock);
        U any = 0;
        for (int64_t i = b; i < e; ++i) any |= U((p[i] & mask) > limit);
        if (!any) continue;
        for (int64_t i = b; i < e; ++i)
            if ((p[i] & mask) > limit) return i;
    }
    return n;
}

float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return man ? NAN : (sign ? -INFINITY : INFINITY);
    float v = exp ? std::ldexp(float(man | 0x400), int(exp) - 25) : std::ldexp(float(man), -24);
    return sign ? -v : v;
}
}  // namespace

WeightCheckStats check_weight_values(const std::map<std::string, Tensor>& weights, const std::string& source, float max_abs) {
    const auto t0 = std::chrono::steady_clock::now();
    WeightCheckStats st;
    uint32_t lim32;
    std::memcpy(&lim32, &max_abs, 4);
    const uint16_t lim_bf16 = uint16_t(lim32 >> 16);
    // Work items of at most 1M elements, so one big tensor (the embedding) spreads over threads.
    struct Item {
        const std::string* name;
        const Tensor* t;
        int64_t begin, end;
        int64_t bad;  // first offending index in [begin, end), or end
    };
    std::vector<Item> items;
    constexpr int64_t kItem = int64_t(1) << 20;
    for (const auto& [name, t] : weights) {
        if (t.device().type != DeviceType::CPU || !t.is_contiguous() || t.numel() == 0) continue;
        if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16) continue;
        st.elements += t.numel();
        for (int64_t b = 0; b < t.numel(); b += kItem) items.push_back({&name, &t, b, std::min(t.numel(), b + kItem), 0});
    }
#pragma omp parallel for schedule(dynamic, 1) if (items.size() > 1)
    for (size_t k = 0; k < items.size(); ++k) {
        Item& it = items[k];
        const int64_t n = it.end - it.begin;
        int64_t bad = n;
        if (it.t->dtype() == DType::F32)
            bad = first_above<uint32_t>(static_cast<const uint32_t*>(it.t->data_ptr()) + it.begin, n, 0x7fffffffu, lim32);
        else if (it.t->dtype() == DType::BF16)
            bad = first_above<uint16_t>(static_cast<const uint16_t*>(it.t->data_ptr()) + it.begin, n, 0x7fff, lim_bf16);
        else  // f16 cannot exceed 65504, so only Inf/NaN (exponent all ones) can be wrong
            bad = first_above<uint16_t>(static_cast<const uint16_t*>(it.t->data_ptr()) + it.begin, n, 0x7fff, 0x7bff);
        it.bad = it.begin + bad;
    }
    for (const Item& it : items) {
        if (it.bad >= it.end) continue;
        float value = 0;
        if (it.t->dtype() == DType::F32) {
            std::memcpy(&value, static_cast<const uint32_t*>(it.t->data_ptr()) + it.bad, 4);
        } else {
            const uint16_t h = static_cast<const uint16_t*>(it.t->data_ptr())[it.bad];
            if (it.t->dtype() == DType::F16) {
                value = half_to_float(h);
            } else {
                const uint32_t b = uint32_t(h) << 16;
                std::memcpy(&value, &b, 4);
            }
        }
        throw Error(str(source, ": tensor '", *it.name, "' element ", it.bad, " (of ", it.t->numel(), ") is ", value,
                        std::isfinite(value) ? str(", beyond the plausible weight magnitude ", max_abs) : std::string(),
                        "; expected finite weights (the file is corrupt: a damaged block scale, flipped bits, or a "
                        "tensor type that disagrees with its data)"),
                    "re-download or re-convert the model file");
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
}

}  // namespace kv
