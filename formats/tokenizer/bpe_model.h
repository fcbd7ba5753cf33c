// The BPE model: vocabulary, merge ranks and the merge loop that turns one pre-token (a word in
// the model's alphabet) into ids, with a per-word cache. Supports ignore_merges (Llama 3),
// byte_fallback (<0xNN> tokens) and an unknown token. Must not split text into words or know
// about added tokens; the pipeline does that.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kv {

// Ids at or above this are rejected as corrupt (the largest real vocabularies hold ~260k tokens);
// it keeps a bad file from requesting gigabytes of id tables.
inline constexpr int32_t kMaxTokenId = (1 << 24) - 1;

struct BpeOptions {
    bool ignore_merges = false;  // a word that is itself in the vocab is emitted whole
    bool byte_fallback = false;  // characters missing from the vocab become <0xNN> byte tokens
    std::string unk_token;       // "" = none: unknown characters are dropped (as Hugging Face does)
    bool fuse_unk = false;       // consecutive unknowns become one unk token
};

class BpeModel {
   public:
    // `vocab`: (token, id) pairs; `merges`: (left, right) in rank order. Throws kv::Error whose
    // message starts with `source` (the file) and names the bad entry.
    BpeModel(const std::vector<std::pair<std::string, int32_t>>& vocab,
             const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions opt, const std::string& source);
    // GGUF form: `tokens[id]` is the string of id. A string that occurs twice resolves to its
    // first id (as llama.cpp's lookup does); empty strings are decodable holes, never matched.
    BpeModel(const std::vector<std::string>& tokens, const std::vector<std::pair<std::string, std::string>>& merges,
             BpeOptions opt, const std::string& source);
    BpeModel(const BpeModel&) = delete;
    BpeModel& operator=(const BpeModel&) = delete;

    // Appends the ids of one word (already in the model alphabet).
    void encode_word(std::string_view word, std::vector<int32_t>& out) const;

    int32_t token_to_id(std::string_view token) const;  // -1 if absent
    // Token string for an id, or nullptr when no vocab entry has that id.
    const std::string* id_to_token(int32_t id) const;
    int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }
    const BpeOptions& options() const { return opt_; }

   private:
    struct MergeInfo {
        int32_t rank;
        int32_t merged_id;
    };
    static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
    void merge_word(std::string_view word, std::vector<int32_t>& out) const;
    void init_merges_and_specials(const std::vector<std::pair<std::string, std::string>>& merges,
                                  const std::string& source);

    BpeOptions opt_;
    std::unordered_map<std::string, int32_t> token_to_id_;
    std::vector<std::string> id_to_token_;
    std::vector<bool> has_id_;
    std::unordered_map<uint64_t, MergeInfo> merges_;
    int32_t unk_id_ = -1;
    int32_t byte_ids_[256];  // <0xNN> token ids for byte_fallback (-1 when absent)

    // Word -> ids cache. Words repeat heavily in prose, so most lookups skip the merge loop.
    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kv
