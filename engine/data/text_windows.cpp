// Text windows (see text_windows.h).
#include "text_windows.h"

#include <fstream>
#include <sstream>

#include "engine/core/error.h"

namespace kv {

TextWindows make_text_windows(const std::vector<std::string>& files, const Tokenizer& tok, int64_t seq_length, int64_t max_windows) {
    if (files.empty()) throw Error("--data.files: no text files given", "e.g. --data.files /usr/share/common-licenses/GPL-3");
    std::string text;
    for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        if (!in) throw Error(str("--data.files: cannot read '", f, "'; expected a readable text file"));
        std::ostringstream ss;
        ss << in.rdbuf();
        text += ss.str();
        if (!text.empty() && text.back() != '\n') text += '\n';
    }
    TextWindows w;
    std::vector<int32_t> ids;
    // Ask the tokenizer rather than its BOS id: a model may have a BOS token it never prepends.
    if (tok.bos_id() >= 0) {
        const std::vector<int32_t> probe = tok.encode("a", true);
        w.bos = !probe.empty() && probe.front() == tok.bos_id();
    }
    if (w.bos) ids.push_back(tok.bos_id());
    std::vector<int32_t> body = tok.encode(text, false);
    ids.insert(ids.end(), body.begin(), body.end());
    w.total_tokens = int64_t(ids.size());
    if (int64_t(ids.size()) < seq_length)
        throw Error(str("--data.seq_length: the text has ", ids.size(), " tokens, fewer than one window of ", seq_length),
                    "add files or lower --data.seq_length");
    for (int64_t s = 0; s + seq_length <= int64_t(ids.size()) && int64_t(w.windows.size()) < max_windows; s += seq_length)
        w.windows.emplace_back(ids.begin() + s, ids.begin() + s + seq_length);
    return w;
}

}  // namespace kv
