// Wrapping a user message in a model's chat format without a template engine: ChatML
// (SmolLM2, Qwen) and Llama 3, recognised by their special tokens.
#pragma once

#include <string>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

// Throws kv::Error when the tokenizer has neither format's tokens.
std::string chat_prompt(const Tokenizer& tok, const std::string& user_message);
// What closes the assistant's turn before the next user message of a conversation (ChatML
// "<|im_end|>\n", Llama 3 "<|eot_id|>"). Throws as chat_prompt does.
std::string chat_turn_end(const Tokenizer& tok);

}  // namespace kv
