// Op cases for the consistency suite (modelled on llama.cpp's test-backend-ops): each case
// builds one call with fresh random inputs in a chosen layout; the runner executes it on every
// backend and compares against the f64 reference (CPU) or the CPU result (other backends).
// Cases are split by op family into op_cases_<family>.cpp and register themselves.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/common/op.h"

namespace kv::test {

// How an input or output is laid out in memory.
enum class Layout {
    CONTIG,      // plain row-major
    TRANSPOSED,  // last two dims stored swapped (a .transpose(-1, -2) view)
    STRIDED,     // rows padded: a slice of a wider tensor (non-unit row stride)
};

class CaseBuilder {
   public:
    explicit CaseBuilder(uint64_t seed) : rng(seed) {}

    // Random float input in [lo, hi), stored in `dtype`, laid out as requested.
    Tensor input(const Shape& shape, DType dtype, Layout layout = Layout::CONTIG, double lo = -1.0, double hi = 1.0);
    // Integer index tensor with values in [0, limit).
    Tensor index(const Shape& shape, int64_t limit, DType dtype = DType::I32);
    // Index whose values along `axis` are distinct (a permutation prefix per line): safe for scatter.
    Tensor unique_index(const Shape& shape, int axis, int64_t limit, DType dtype = DType::I32);
    // Output inside a guarded allocation (sentinel bytes around and between elements).
    // `init_random`: fill the visible elements with random values in [lo, hi) (ops that read
    // or accumulate into dst).
    Tensor output(const Shape& shape, DType dtype, Layout layout = Layout::CONTIG, bool init_random = false, double lo = -1.0,
                  double hi = 1.0);
    // Second and third outputs (SDPA weight sums, extra gradients, optimizer state), guarded
    // and compared like dst. Without init_random they start at -12345, so a value the kernel
    // forgot to write shows up as an error.
    Tensor output2(const Shape& shape, DType dtype, bool init_random = false, double lo = -1.0, double hi = 1.0);
    Tensor output3(const Shape& shape, DType dtype, bool init_random = false, double lo = -1.0, double hi = 1.0);
    // Append a source operand to the call; no_src() appends an absent optional source.
    void src(const Tensor& t);
    void no_src();

    std::mt19937_64 rng;
    OpCall call;
    std::vector<Tensor> srcs;  // undefined entries for absent sources
    Tensor dst;
    Tensor dst2;          // optional second output
    Tensor dst3;          // optional third output
    Tensor dst_storage;   // the whole guarded allocation of dst (1-D, same dtype)
    Tensor dst2_storage;  // ... of dst2
    Tensor dst3_storage;  // ... of dst3

   private:
    Tensor guarded(const Shape& shape, DType dtype, Layout layout, Tensor* storage);
};

struct OpCase {
    std::string name;  // "<op>/<dtypes>/<shape and layout>" — printed in the test name
    double max_err;    // max |got - ref| / max |ref| allowed against the f64 reference
    std::function<void(CaseBuilder&)> build;
};

std::vector<OpCase>& op_cases();

struct RegisterOpCases {
    explicit RegisterOpCases(const std::function<void(std::vector<OpCase>&)>& add) { add(op_cases()); }
};

// Appends SDPA's kpos (B|1, G|1, T) and qpos (1, n) sources. Unscattered: slots hold positions
// 0..T-1 and queries the last n of them (prefill or a chunk). Scattered: T - n old positions
// drawn from [0, 2T) plus the n new ones at 2T.., shuffled over the slots (a cache after
// evictions); per_row gives every (b, g) its own draw.
void sdpa_positions(CaseBuilder& b, int64_t B, int64_t G, int64_t n, int64_t T, bool scattered, bool per_row);

// Tolerances relative to max |ref|, by output dtype (see the comments in op_cases.cpp).
double tol_for(DType out);

// Sentinel checks: every byte of each output's guarded allocation outside its visible view
// still holds the pattern.
bool guards_intact(const CaseBuilder& b, std::string* where);

}  // namespace kv::test
