// Stream decoding by re-decoding a short window of recent ids and returning the new complete
// suffix. Must not assume a tokenizer type: only Tokenizer::decode is used.
#include "stream_decoder.h"

#include "tokenizer.h"
#include "utf8.h"

namespace kv {

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens, const std::vector<int32_t>& context)
    : tok_(&tok), skip_special_(skip_special_tokens) {
    reset(context);
}

void StreamDecoder::reset(const std::vector<int32_t>& context) {
    window_ = context;
    trim_to_context();
}

// Keeps the last token that produces text (and any skipped specials after it) as left context:
// decoders that strip the space of a sequence's first token then strip it from that token,
// not from the next one. Everything kept counts as already emitted.
void StreamDecoder::trim_to_context() {
    size_t keep_from = window_.empty() ? 0 : window_.size() - 1;
    for (size_t k = window_.size(); k-- > 0;) {
        if (!(skip_special_ && tok_->is_special(window_[k]))) {
            keep_from = k;
            break;
        }
    }
    window_.erase(window_.begin(), window_.begin() + std::ptrdiff_t(keep_from));
    emitted_ = tok_->decode(window_, skip_special_).size();
}

std::string StreamDecoder::push(int32_t id) {
    window_.push_back(id);
    const std::string text = tok_->decode(window_, skip_special_);
    const size_t complete = text.size() - utf8::incomplete_tail(text);
    std::string out;
    if (complete > emitted_) {
        out = text.substr(emitted_, complete - emitted_);
        emitted_ = complete;
    }
    if (complete == text.size()) trim_to_context();  // everything is out: keep only context
    return out;
}

std::string StreamDecoder::flush() {
    const std::string text = tok_->decode(window_, skip_special_);
    std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
    window_.clear();
    emitted_ = 0;
    return out;
}

}  // namespace kv
