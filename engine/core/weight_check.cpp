// Weight sanity at load (see weight_check.h).
#include "engine/core/weight_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

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

WeightCheckStats check_weights(const std::map<std::string, Tensor>& weights, const std::string& source, float max_abs) {
    const auto t0 = std::chrono::steady_clock::now();
    WeightCheckStats st;
    uint32_t lim32;
    std::memcpy(&lim32, &max_abs, 4);
    const uint16_t lim_bf16 = uint16_t(lim32 >> 16);
    for (const auto& [name, t] : weights) {
        if (t.device().type != DeviceType::CPU || !t.is_contiguous() || t.numel() == 0) continue;
        const int64_t n = t.numel();
        int64_t bad = n;
        float value = 0;
        if (t.dtype() == DType::F32) {
            const uint32_t* p = static_cast<const uint32_t*>(t.data_ptr());
            bad = first_above<uint32_t>(p, n, 0x7fffffffu, lim32);
            if (bad < n) std::memcpy(&value, p + bad, 4);
        } else if (t.dtype() == DType::BF16) {
            const uint16_t* p = static_cast<const uint16_t*>(t.data_ptr());
            bad = first_above<uint16_t>(p, n, 0x7fff, lim_bf16);
            if (bad < n) {
                uint32_t b = uint32_t(p[bad]) << 16;
                std::memcpy(&value, &b, 4);
            }
        } else if (t.dtype() == DType::F16) {
            // f16 cannot exceed 65504, so only Inf/NaN (exponent all ones) can be wrong.
            const uint16_t* p = static_cast<const uint16_t*>(t.data_ptr());
            bad = first_above<uint16_t>(p, n, 0x7fff, 0x7bff);
            if (bad < n) value = half_to_float(p[bad]);
        } else {
            continue;
        }
        st.elements += n;
        if (bad < n)
            throw Error(str(source, ": tensor '", name, "' element ", bad, " (of ", n, ") is ", value,
                            std::isfinite(value) ? str(", beyond the plausible weight magnitude ", max_abs) : std::string(),
                            "; expected finite weights (the file is corrupt: a damaged block scale, flipped bits, or a "
                            "tensor type that disagrees with its data)"),
                        "re-download or re-convert the model file");
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
}

}  // namespace kv
