#include "filler_text.h"

#include <algorithm>

namespace kv {

std::vector<int32_t> filler_tokens(std::mt19937_64& rng, const Tokenizer& tok, int64_t n, const std::vector<std::string>& sentences,
                                   const std::string& sep) {
    std::vector<int32_t> out;
    while (int64_t(out.size()) < n) {
        std::string text;
        for (int i = 0; i < 64; ++i) text += sep + sentences[rng() % sentences.size()];
        auto ids = tok.encode(text, false);
        out.insert(out.end(), ids.begin(), ids.end());
    }
    out.resize(size_t(std::max<int64_t>(n, 0)));
    return out;
}

}  // namespace kv
