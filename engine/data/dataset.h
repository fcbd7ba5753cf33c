// What the long-context data loaders (LongBench v2, HELMET) share, reference §12: the record
// type, reading JSON / JSON Lines records with typed field errors, the token-length metadata
// cache, the seeded train/val split and similar-length micro-batching with a resumable order.
// Must not know any dataset's fields or prompt format, and never downloads anything.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

// Index: [SECTION] records  [SECTION] json files  [SECTION] metadata cache
//        [SECTION] tokenizing with the cache  [SECTION] train/val split  [SECTION] batches

// ==== [SECTION] records =====================================================================

// One prompt with its answer(s). The prompt is fully formatted and tokenized; the response is
// tokenized by the training code (it picks one of `targets` and appends EOS, reference §8).
struct DataRecord {
    std::string id;                    // LongBench v2 `_id` / HELMET `query_id`
    int64_t source_index = -1;         // position in the source file (its split for HELMET)
    std::vector<int32_t> prompt_ids;   // (T) prompt tokens, BOS first when the tokenizer adds one
    int64_t num_tokens = 0;            // T (the reference's num_tokens_instruction)
    int32_t label = -1;                // class index in [0, C) for 4-way choice; -1: free text
    std::vector<std::string> targets;  // answer texts; any one is a valid response
    // Raw fields for sample metrics and breakdowns (LongBench: domain, difficulty, length,
    // question, choice_A..D, answer; HELMET: every field but input/output, non-strings as JSON).
    std::map<std::string, std::string> fields;
};

// What a loader returns: records kept for training (split later into train/val) and the
// test set, plus where the token lengths came from.
struct LoadedDataset {
    std::vector<DataRecord> dev;           // <= max_seq_length, in file order
    std::vector<DataRecord> test;          // LongBench "rest": longer records, ascending; HELMET: eval split
    int64_t num_source_records = 0;        // records in the file(s) before filtering
    std::vector<int32_t> class_token_ids;  // (C) token of each class label (LongBench v2), else empty
    std::string metadata_path;             // the length cache file used
    bool lengths_from_cache = false;       // every length came from the cache (nothing re-tokenized to measure)
    std::vector<std::string> notes;        // why the cache was (re)computed or could not be written
};

// One target index per record, drawn from the seed (reference: `target_choice`, part of the
// training state): records with several valid answers train on a fixed, reproducible one.
std::vector<int32_t> draw_target_choices(const std::vector<DataRecord>& records, uint64_t seed);

// ==== [SECTION] json files ==================================================================

// The objects of `path`: a JSON array of objects, or JSON Lines (one object per line), told
// apart by the first non-blank character. `what` names the dataset in errors, which give the
// file, line and column of a syntax error, or the index of an element that is not an object.
// The file must exist (loaders check first, with their own "where to get it" hint).
std::vector<nlohmann::json> read_json_records(const std::string& path, const std::string& what);

// Typed access to a record's field; `where` names the record ("data.json record 3 (_id x)").
// Throws kv::Error "<where>: field 'f' is missing; expected a string" / "... is a number; ...".
const std::string& json_string_field(const nlohmann::json& obj, const char* name, const std::string& where);
// Like json_string_field, but a missing field gives `fallback`.
std::string json_string_field_or(const nlohmann::json& obj, const char* name, const std::string& fallback,
                                 const std::string& where);

bool file_exists(const std::string& path);

// "a string", "a number", "an array", ... for messages.
const char* json_type_phrase(const nlohmann::json& v);

// ==== [SECTION] metadata cache ==============================================================
// Token lengths of every source record, in a JSON file shared by runs and models:
// {"sequence_lengths": {...nested keys...: [len, ...]}}. Tokenizing a long-context set takes
// minutes; the lengths do not depend on max_seq_length, so one entry serves every filter.

struct LengthCache {
    std::string path;                   // <metadata_dir>/<dataset>_metadata.json
    std::vector<std::string> key_path;  // e.g. {"sequence_lengths", "<model>"}
};

// The cached lengths if present and valid for `expected_count` records (a list of that many
// integers >= 0); otherwise nullopt and *why says what was missing or stale.
std::optional<std::vector<int64_t>> length_cache_load(const LengthCache& cache, int64_t expected_count, std::string* why);

// Sets the entry (other entries of the file kept; an unreadable file is replaced) and
// replaces the file atomically (temp file + rename), creating the folder if needed. Returns
// false with *why when it cannot be written: the cache is an optimisation, never fatal.
bool length_cache_store(const LengthCache& cache, const std::vector<int64_t>& lengths, std::string* why);

// The folder of the cache: `metadata_dir` when given, else `default_dir`.
std::string metadata_dir_or(const std::string& metadata_dir, const std::string& default_dir);

// ==== [SECTION] tokenizing with the cache ===================================================

// Prompts are encoded with the tokenizer's special tokens (BOS) but without parsing special
// tokens' text: documents are untrusted, and a "<|im_end|>" inside one must stay text.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& prompt);

enum class Pick : uint8_t { PICK_DROP, PICK_KEEP, PICK_TEST };

struct PickedPrompt {
    int64_t index = -1;  // source record
    int64_t num_tokens = 0;
    std::vector<int32_t> ids;     // (num_tokens) encode_prompt(prompt(index))
    Pick pick = Pick::PICK_KEEP;  // PICK_KEEP or PICK_TEST
};

struct PromptPass {
    std::vector<PickedPrompt> picked;  // in source order
    bool from_cache = false;           // every length came from the cache
};

// Measures `count` prompts and picks records by length. Lengths come from the cache when it
// is valid for `count` records (and `recompute` is false); otherwise every prompt is encoded
// and the new list stored. Picked prompts are always encoded; if one disagrees with its
// cached length the cache is stale (tokenizer changed under the same name) and the pass
// restarts without it. `max_keep` > 0 ends the pass after that many PICK_KEEP records
// (debug runs); such partial passes do not write the cache. Notes explain cache decisions.
PromptPass tokenize_and_pick(const Tokenizer& tok, const LengthCache& cache, bool recompute, int64_t count,
                             const std::function<std::string(int64_t)>& prompt,
                             const std::function<Pick(int64_t num_tokens)>& pick, int64_t max_keep,
                             std::vector<std::string>* notes);

// ==== [SECTION] train/val split =============================================================

// Disjoint index sets covering [0, n). Part of the training state, so a resumed run trains
// on the same records even if the split rule changes.
struct TrainValSplit {
    std::vector<int64_t> train;
    std::vector<int64_t> val;
};

// torch's random_split with fractions [1 - f, f]: sizes floor(n (1 - f)) and floor(n f),
// the remainder dealt one by one starting with train; a seeded permutation of [0, n) is cut
// into train then val. The permutation is ours (mt19937_64 + Fisher-Yates), not torch's,
// so the indices differ from the reference while the sizes match. f in [0, 1).
TrainValSplit split_train_val(int64_t n, double val_fraction, uint64_t seed);

nlohmann::json split_to_json(const TrainValSplit& split);
// Throws kv::Error unless the indices are disjoint and cover exactly [0, n).
TrainValSplit split_from_json(const nlohmann::json& j, int64_t n);

// The records at `indices`, in that order.
std::vector<DataRecord> select_records(const std::vector<DataRecord>& records, const std::vector<int64_t>& indices);

// ==== [SECTION] batches =====================================================================

// Micro-batches of indices into `lengths`, each of records of similar length: indices sorted
// by ascending length (ties by index), cut into micro_batch_size pieces from the shortest;
// the shorter remainder batch comes last and holds the longest records (reference
// SimilarSequenceLengthIterator with one device).
std::vector<std::vector<int64_t>> similar_length_batches(const std::vector<int64_t>& lengths, int64_t micro_batch_size);

struct BatchOrderOptions {
    int64_t micro_batch_size = 1;
    bool shuffle = true;          // random batch order per epoch (validation/test: false)
    bool longest_first = false;   // first epoch starts with the longest batch (meets OOM early)
    bool shortest_first = false;  // every epoch starts with the shortest batch (as the reference)
    uint64_t seed = 42;           // epoch e's order comes from (seed, e) alone
};

// Hands out micro-batches epoch after epoch. Its state (epoch, position, partition and the
// epoch's permutation) is JSON, so a resumed run continues with the very next batch.
class BatchIterator {
   public:
    // Throws kv::Error for micro_batch_size < 1, both *_first options, or no records.
    BatchIterator(std::vector<int64_t> lengths, const BatchOrderOptions& opt);

    // Indices (into `lengths`) of the next micro-batch, ascending by length. After the last
    // batch of an epoch the next call starts a new epoch.
    const std::vector<int64_t>& next();

    int64_t num_batches() const { return (int64_t)partition_.size(); }
    int64_t epoch() const { return epoch_; }        // epochs started (0 before the first next())
    int64_t position() const { return position_; }  // batches handed out in the current epoch
    const std::vector<std::vector<int64_t>>& partition() const { return partition_; }
    const std::vector<int64_t>& permutation() const { return permutation_; }  // batch order of this epoch

    nlohmann::json state() const;
    // Throws kv::Error when the state was saved for other records or options (different
    // partition) or is malformed: resuming on different data must not pass silently.
    void restore(const nlohmann::json& state);

   private:
    void start_epoch();

    BatchOrderOptions opt_;
    std::vector<std::vector<int64_t>> partition_;  // micro-batches, ascending length
    std::vector<int64_t> permutation_;             // order of partition_ in this epoch
    int64_t epoch_ = 0;
    int64_t position_ = 0;
};

}  // namespace kv
