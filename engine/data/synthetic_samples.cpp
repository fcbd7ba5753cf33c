// Synthetic retrieval samples by index (see synthetic_samples.h).
#include "synthetic_samples.h"

#include "synthetic.h"

namespace kv {

std::vector<std::vector<int32_t>> synthetic_samples(const std::string& task, int64_t seq_length, int64_t count, uint64_t seed,
                                                    const Tokenizer& tok) {
    SyntheticSpec spec;
    spec.task = task;
    spec.seq_length = seq_length;
    spec.seed = seed;
    std::vector<std::vector<int32_t>> out;
    for (int64_t i = 0; i < count; ++i) out.push_back(make_synthetic_sample(spec, i, tok).ids);
    return out;
}

}  // namespace kv
