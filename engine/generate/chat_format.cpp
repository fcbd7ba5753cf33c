// Chat wrapping (see chat_format.h).
#include "chat_format.h"

#include "engine/core/error.h"

namespace kv {

std::string chat_prompt(const Tokenizer& tok, const std::string& user) {
    if (tok.token_id("<|im_start|>") >= 0) return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
    if (tok.token_id("<|start_header_id|>") >= 0)
        return "<|start_header_id|>user<|end_header_id|>\n\n" + user + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    throw Error("--chat: this tokenizer has no ChatML or Llama 3 chat tokens", "drop --chat for this model");
}

std::string chat_turn_end(const Tokenizer& tok) {
    if (tok.token_id("<|im_start|>") >= 0) return "<|im_end|>\n";
    if (tok.token_id("<|start_header_id|>") >= 0) return "<|eot_id|>";
    throw Error("--chat: this tokenizer has no ChatML or Llama 3 chat tokens", "drop --chat for this model");
}

}  // namespace kv
