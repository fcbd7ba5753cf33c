// HELMET tasks (reference §12) from local JSON Lines / JSON files that keys_values'
// load_helmet_dev_eval builds: every instance is a finished prompt (input, output, query_id,
// max_length). The dev split becomes train/val, the eval split (the original HELMET
// instances) the test set. Must never build instances or download data.
#pragma once

#include <string>
#include <vector>

#include "dataset.h"
#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct HelmetOptions {
    // Folder holding <dataset_key>_<max_length>/development.jsonl and evaluation.jsonl (or
    // .json arrays): the splits of keys_values' cache ~/.cache/huggingface/helmet/longtrain/.
    std::string path;
    std::string dataset_key;        // nq, trivia_qa, ... (helmet_dataset_keys())
    std::string max_length = "8k";  // 8k | 16k | 32k | 64k | 128k (K = 1024)
    std::string model_name;         // keys the length cache: lengths depend on the tokenizer
    int64_t max_seq_length = 0;     // > 0: keep records with <= this many prompt tokens (both splits)
    std::string metadata_dir;       // folder of helmet_metadata.json ("": `path`)
    bool recompute_lengths = false;
};

const std::vector<std::string>& helmet_dataset_keys();
const std::vector<std::string>& helmet_max_lengths();

// The file of one split ("development" or "evaluation"): .jsonl if present, else .json;
// when neither exists, the .jsonl path (for the error message).
std::string helmet_split_file(const HelmetOptions& opt, const std::string& split);

// sequence_lengths[dataset_key][max_length][model_name][split] in <metadata_dir>/helmet_metadata.json,
// split "dev" or "eval".
LengthCache helmet_length_cache(const HelmetOptions& opt, const std::string& split);

// Loads and validates both splits: input a string; output a string or a non-empty list of
// strings (targets); query_id a string (the record id); max_length equal to opt.max_length.
// `dev` = development records, `test` = evaluation records, both filtered by max_seq_length
// and in file order.
LoadedDataset load_helmet(const HelmetOptions& opt, const Tokenizer& tok);

}  // namespace kv
