// Key re-rotation (see key_rotation.h).
#include "engine/kv/key_rotation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "engine/core/error.h"

namespace kv {

namespace {

// cos and sin of shift * inv_freq[j] for each shift a call meets, computed once per shift: a
// row's shifts take few values (how many tokens left before each kept one), and std::cos and
// std::sin per channel and slot were most of a re-rotated chunk's cost. The values are those
// of the same calls, so the turned keys are the bits rotate_by_positions gives.
class AngleTable {
   public:
    explicit AngleTable(const std::vector<double>& inv_freq) : f_(inv_freq) {}
    // The half cos values, then the half sin values, of `shift`.
    const double* at(int64_t shift) {
        auto it = table_.find(shift);
        if (it != table_.end()) return it->second.data();
        const size_t half = f_.size();
        std::vector<double> cs(2 * half);
        for (size_t j = 0; j < half; ++j) {
            const double a = double(shift) * f_[j];
            cs[j] = std::cos(a), cs[half + j] = std::sin(a);
        }
        return table_.emplace(shift, std::move(cs)).first->second.data();
    }

   private:
    const std::vector<double>& f_;
    std::unordered_map<int64_t, std::vector<double>> table_;
};

void check_channels(int64_t half, int64_t D) {
    if (2 * half > D) throw Error(str("key re-rotation: ", 2 * half, " rotated channels in a head of ", D));
}

// x turned by the angles cs (AngleTable::at) of its half rotated channel pairs, in double (a
// float x is read into double and the result rounded once, as a trip through f64 would).
template <class T>
void turn(T* x, int64_t half, const double* cs) {
    for (int64_t j = 0; j < half; ++j) {
        const double c = cs[j], s = cs[half + j];
        const double x1 = x[j], x2 = x[j + half];
        x[j] = T(x1 * c - x2 * s);
        x[j + half] = T(x2 * c + x1 * s);
    }
}

// The turned copy of x: f32 tensors are turned as floats (no f64 copy of the whole cache);
// other dtypes through f64, rounded once to their own type.
template <class Body>
Tensor turned_copy(const Tensor& x, const TensorOptions& opt, Body body) {
    if (x.dtype() == DType::F32) {
        std::vector<float> v = x.contiguous().to_f32_vector();
        body(v.data());
        return Tensor::from_f32(x.shape(), v, DType::F32, opt);
    }
    std::vector<double> v = x.contiguous().to_f64_vector();
    body(v.data());
    return Tensor::from_f64(x.shape(), v, x.dtype(), opt);
}

}  // namespace

void rotate_by_positions(double* x, int64_t D, const std::vector<double>& inv_freq, int64_t shift) {
    const int64_t half = int64_t(inv_freq.size());
    if (shift == 0 || half == 0) return;
    check_channels(half, D);
    AngleTable t(inv_freq);
    turn(x, half, t.at(shift));
}

void contiguous_rope_row(const int32_t* pos, int64_t slots, int32_t* rope) {
    std::vector<int32_t> order;
    for (int64_t s = 0; s < slots; ++s) {
        rope[s] = -1;
        if (pos[s] >= 0) order.push_back(int32_t(s));
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
    for (size_t i = 0; i < order.size(); ++i) rope[order[i]] = int32_t(i);
}

void rerotate_row(const SlotPlan& plan, int64_t row, const int32_t* pos_after, int32_t* rope, int64_t slots, int32_t* shift) {
    apply_plan_to_row(plan, row, rope, slots);  // moves carry their angle; new tokens come at their position
    std::vector<int32_t> target((size_t)slots);
    contiguous_rope_row(pos_after, slots, target.data());
    for (int64_t s = 0; s < slots; ++s) {
        shift[s] = target[size_t(s)] >= 0 ? target[size_t(s)] - rope[s] : 0;
        rope[s] = target[size_t(s)];
    }
}

int64_t query_shift(const std::vector<int32_t>& pos_after, int64_t rows, int64_t slots, int64_t input_pos) {
    int64_t kept = -1;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t k = 0;
        for (int64_t s = 0; s < slots; ++s) {
            const int32_t p = pos_after[size_t(r * slots + s)];
            k += p >= 0 && p < input_pos;
        }
        if (kept >= 0 && k != kept)
            throw Error(str("key re-rotation: slot rows keep ", kept, " and ", k, " tokens before position ", input_pos),
                        "the queries of a chunk take one RoPE position per token, so every row must keep as many");
        kept = k;
    }
    return std::max<int64_t>(kept, 0) - input_pos;
}

Tensor rotate_slots(const Tensor& x, const std::vector<int32_t>& shift, int64_t rows, const std::vector<double>& inv_freq,
                    const TensorOptions& opt) {
    const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
    if (int64_t(shift.size()) < rows * S || (rows != 1 && rows != B * H))
        throw Error(str("key re-rotation: ", shift.size(), " shifts in ", rows, " rows for keys of ", B, " x ", H, " x ", S));
    const int64_t half = int64_t(inv_freq.size());
    if (half > 0) check_channels(half, D);
    return turned_copy(x, opt, [&](auto* v) {
        if (half == 0) return;
        AngleTable t(inv_freq);
        for (int64_t r = 0; r < B * H; ++r)
            for (int64_t s = 0; s < S; ++s)
                if (const int64_t sh = shift[size_t((rows == 1 ? 0 : r) * S + s)]; sh != 0) turn(v + (r * S + s) * D, half, t.at(sh));
    });
}

Tensor rotate_all(const Tensor& x, int64_t shift, const std::vector<double>& inv_freq, const TensorOptions& opt) {
    const int64_t D = x.size(-1), half = int64_t(inv_freq.size()), rows = x.numel() / std::max<int64_t>(D, 1);
    if (shift != 0 && half > 0) check_channels(half, D);
    return turned_copy(x, opt, [&](auto* v) {
        if (shift == 0 || half == 0) return;
        AngleTable t(inv_freq);
        const double* cs = t.at(shift);
        for (int64_t i = 0; i < rows; ++i) turn(v + i * D, half, cs);
    });
}

}  // namespace kv
