// Row map for un-permuting llama.cpp Q/K weights (formula and evidence in the header).
#include "formats/gguf/gguf_rope_permute.h"

#include "engine/core/error.h"

namespace kv {

std::vector<int64_t> gguf_unpermute_rows(int64_t n_rows, int64_t n_heads, const std::string& what) {
    if (n_heads <= 0 || n_rows <= 0 || n_rows % (2 * n_heads) != 0)
        throw Error(str(what, ": ", n_rows, " rows cannot be split into ", n_heads,
                        " heads of an even head size (needed to undo llama.cpp's Q/K permutation)"));
    const int64_t D = n_rows / n_heads, half = D / 2;
    std::vector<int64_t> map(static_cast<size_t>(n_rows));
    for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < half; ++i)
            for (int64_t j = 0; j < 2; ++j) map[size_t(h * D + 2 * i + j)] = h * D + j * half + i;
    return map;
}

}  // namespace kv
