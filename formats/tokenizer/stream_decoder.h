// Incremental decoding for printing generated tokens one at a time: push() returns only text
// that is final, never a broken UTF-8 sequence (a character split over byte tokens waits for its
// last byte), and keeps spaces right for decoders that strip the first token's space.
// Works with any kv::Tokenizer through decode(); must not hold more than a few tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv {

class Tokenizer;

class StreamDecoder {
   public:
    // `context`: the ids just before the first pushed one (e.g. the prompt's tail), so the first
    // generated token keeps its leading space. The tokenizer must outlive the decoder.
    explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = true,
                           const std::vector<int32_t>& context = {});

    // Adds one id; returns the newly completed text (possibly empty).
    std::string push(int32_t id);
    // Returns whatever is still held back (an unfinished sequence as raw bytes) and resets.
    std::string flush();
    void reset(const std::vector<int32_t>& context = {});

   private:
    void trim_to_context();

    const Tokenizer* tok_;
    bool skip_special_;
    std::vector<int32_t> window_;  // recent ids: context plus ids whose text is not all out yet
    size_t emitted_ = 0;           // bytes of decode(window_) already returned (or context)
};

}  // namespace kv
