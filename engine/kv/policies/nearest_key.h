// The kept key most cosine-similar to each evicted key (merging-*'s target), with the decisions
// of the exact definition: cos(e, k) = (sum_d e_d k_d) / (|e| |k|) with every product and sum in
// double, d in order (a product of two floats is exact in double), ties to the lower index, and a
// zero key at cosine 0 to everything. All pairs are first compared through an f32 product (twice
// the lanes of a double one, and fused multiply-adds); only the keys within that product's rounding bound of a
// row's best are recomputed in double, so the result is the exact search's, bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

struct NearestKeyScratch {
    std::vector<float> kt, e, dots, bmax, rk;
    std::vector<double> kn;
    std::vector<int32_t> cols;
};

// Keys are rows of D floats at `keys`; for each evicted row evicted[j], best[j] = the index
// into `kept` of its most similar kept row, cos[j] that cosine (exact as above; -1 and -2 when
// no cosine compares, as with NaN keys).
void nearest_by_cosine(const float* keys, int64_t D, const int32_t* evicted, int64_t ne, const int32_t* kept, int64_t nk, int32_t* best,
                       double* cos, NearestKeyScratch& s);

}  // namespace kv
