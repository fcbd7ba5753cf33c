// LongBench v2 (THUDM/LongBench-v2, split "train") from a local JSON file, reference §12: the
// 0-shot prompt with a head-specific tail, the answer letter as class index, max_seq_length
// filtering, the "rest" test set and the token-length cache. Must never download the data:
// a missing file is a kv::Error saying where to get it.
#pragma once

#include <array>
#include <string>

#include "dataset.h"
#include "engine/driver/head_model.h"
#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct LongBenchV2Options {
    std::string path;                                  // JSON array (or JSON Lines) of the HF train split's records
    std::string head_model = "next_token_prediction";  // | seq_classification_on_logits | seq_classification
    std::string model_name;                            // keys the length cache: lengths depend on the tokenizer
    int64_t max_seq_length = 100000;                   // keep records whose prompt has <= this many tokens
    std::string test_set_tag;                          // "" (no test set) | "rest": all longer records, ascending length
    int64_t debug_num_cases = 0;                       // > 0: stop after this many kept records
    std::string metadata_dir;                          // folder of longbench_v2_metadata.json ("": the data file's)
    bool recompute_lengths = false;
};

// The text fields the prompt is built from.
struct LongBenchV2Fields {
    std::string question;
    std::array<std::string, 4> choices;  // choice_A..choice_D
    std::string context;
};

// Newline-joined lines: the instruction, "", "<text>", context, "</text>", "", the question,
// "Choices:", "A: ..".."D: ..", "", then for next_token_prediction
// `Format your response as follows: "The correct answer is (insert answer here)".`, "",
// "Answer:", "The correct answer is "; for the classification heads only
// "The correct answer is ". The prompt ends with that space; the answer letter follows.
std::string longbench_v2_prompt(const LongBenchV2Fields& f, HeadKind head);

// "A".."D" -> 0..3; anything else is a kv::Error naming `where`.
int32_t longbench_v2_answer_index(const std::string& answer, const std::string& where);

// Where the length cache lives for these options, and the key of this model and prompt tail:
// model_name for next_token_prediction, "<model_name>#classification" for both classification
// heads (the tails differ, so do the lengths; the reference keys by model only).
LengthCache longbench_v2_length_cache(const LongBenchV2Options& opt);

// Loads, validates every record (types, answer letter), tokenizes and filters. `dev` holds the
// records <= max_seq_length in file order; `test` the longer ones when test_set_tag is "rest";
// `class_token_ids` the tokens of "A".."D" by class_tokens()'s rule (spaced when the
// tokenizer has " A".." D" as single tokens) — required for the classification heads.
LoadedDataset load_longbench_v2(const LongBenchV2Options& opt, const Tokenizer& tok);

}  // namespace kv
