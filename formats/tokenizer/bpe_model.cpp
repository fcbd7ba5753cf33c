// BPE merge loop: symbols in a doubly linked list, candidate pairs in a min-heap ordered by
// (rank, position), stale entries skipped on pop — O(n log n) per word, so one huge "word" (a
// base64 blob) cannot go quadratic. Must not split words or handle added tokens.
#include "bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "engine/core/error.h"
#include "utf8.h"

namespace kv {

namespace {
// Words longer than this are not cached (they are rare and would bloat the cache).
constexpr size_t kMaxCachedWordBytes = 256;
// The cache is dropped wholesale when it grows past this many words (bounded memory).
constexpr size_t kMaxCacheEntries = 1 << 18;
}  // namespace

BpeModel::BpeModel(const std::vector<std::pair<std::string, int32_t>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions opt,
                   const std::string& source)
    : opt_(std::move(opt)) {
    int32_t max_id = -1;
    token_to_id_.reserve(vocab.size());
    for (const auto& [tok, id] : vocab) {
        if (id < 0 || id > kMaxTokenId)
            throw Error(str(source, ": vocab entry \"", tok, "\" has id ", id, " (expected 0..", kMaxTokenId, ")"));
        if (!token_to_id_.emplace(tok, id).second)
            throw Error(str(source, ": vocab token \"", tok, "\" appears twice"));
        max_id = std::max(max_id, id);
    }
    id_to_token_.resize(size_t(max_id + 1));
    has_id_.assign(size_t(max_id + 1), false);
    for (const auto& [tok, id] : vocab) {
        if (has_id_[size_t(id)])
            throw Error(str(source, ": vocab id ", id, " is used by both \"", id_to_token_[size_t(id)], "\" and \"", tok,
                            "\" (expected one token per id)"));
        id_to_token_[size_t(id)] = tok;
        has_id_[size_t(id)] = true;
    }
    init_merges_and_specials(merges, source);
}

BpeModel::BpeModel(const std::vector<std::string>& tokens,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions opt,
                   const std::string& source)
    : opt_(std::move(opt)), id_to_token_(tokens), has_id_(tokens.size(), true) {
    token_to_id_.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i)
        if (!tokens[i].empty()) token_to_id_.emplace(tokens[i], int32_t(i));
    init_merges_and_specials(merges, source);
}

void BpeModel::init_merges_and_specials(const std::vector<std::pair<std::string, std::string>>& merges,
                                        const std::string& source) {
    merges_.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
        const auto& [a, b] = merges[r];
        const int32_t ia = token_to_id(a), ib = token_to_id(b);
        const char* missing = ia < 0 ? a.c_str() : ib < 0 ? b.c_str() : nullptr;
        if (missing)
            throw Error(str(source, ": merge #", r, " (\"", a, "\", \"", b, "\") refers to \"", missing,
                            "\", which is not in the vocab (every merge part must be a vocab token)"));
        const int32_t im = token_to_id(a + b);
        if (im < 0)
            throw Error(str(source, ": merge #", r, " (\"", a, "\", \"", b, "\") produces \"", a + b,
                            "\", which is not in the vocab"));
        // A pair listed twice keeps its first (lowest) rank, as llama.cpp does; real files never repeat one.
        merges_.emplace(pair_key(ia, ib), MergeInfo{int32_t(r), im});
    }

    if (!opt_.unk_token.empty()) {
        unk_id_ = token_to_id(opt_.unk_token);
        if (unk_id_ < 0)
            throw Error(str(source, ": unk_token \"", opt_.unk_token, "\" is not in the vocab"));
    }
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        byte_ids_[b] = token_to_id(name);
    }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
    auto it = token_to_id_.find(std::string(token));
    return it == token_to_id_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
    if (id < 0 || size_t(id) >= id_to_token_.size() || !has_id_[size_t(id)]) return nullptr;
    return &id_to_token_[size_t(id)];
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (opt_.ignore_merges) {
        const int32_t id = token_to_id(word);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    const bool cacheable = word.size() <= kMaxCachedWordBytes;
    std::string key;
    if (cacheable) {
        key.assign(word);
        std::lock_guard<std::mutex> lock(cache_mu_);
        auto it = cache_.find(key);
        if (it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    std::vector<int32_t> ids;
    merge_word(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (cache_.size() >= kMaxCacheEntries) cache_.clear();
        cache_.emplace(std::move(key), std::move(ids));
    }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
    struct Sym {
        int32_t id;
        int32_t prev, next;  // neighbours in the list, -1 at the ends
        bool alive;
        bool mergeable;  // byte-fallback and unknown symbols never merge
    };
    std::vector<Sym> syms;
    syms.reserve(word.size());
    auto push = [&](int32_t id, bool mergeable) {
        const int32_t idx = int32_t(syms.size());
        syms.push_back({id, idx - 1, -1, true, mergeable});
        if (idx > 0) syms[size_t(idx - 1)].next = idx;
    };
    for (size_t i = 0; i < word.size();) {
        const size_t n = utf8::char_len_or_one(word, i);
        const int32_t id = token_to_id(word.substr(i, n));
        if (id >= 0) {
            push(id, true);
        } else if (opt_.byte_fallback && [&] {
                       for (size_t k = 0; k < n; ++k)
                           if (byte_ids_[static_cast<uint8_t>(word[i + k])] < 0) return false;
                       return true;
                   }()) {
            for (size_t k = 0; k < n; ++k) push(byte_ids_[static_cast<uint8_t>(word[i + k])], false);
        } else if (unk_id_ >= 0) {
            if (!(opt_.fuse_unk && !syms.empty() && syms.back().id == unk_id_ && !syms.back().mergeable))
                push(unk_id_, false);
        }
        // else: no way to represent the character; Hugging Face drops it as well.
        i += n;
    }

    struct Cand {
        int32_t rank, left, right, left_id, right_id;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const Sym &a = syms[size_t(l)], &b = syms[size_t(r)];
        if (!a.mergeable || !b.mergeable) return;
        auto it = merges_.find(pair_key(a.id, b.id));
        if (it != merges_.end()) heap.push({it->second.rank, l, r, a.id, b.id});
    };
    for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) consider(i, i + 1);

    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        Sym& a = syms[size_t(c.left)];
        Sym& b = syms[size_t(c.right)];
        // Stale if either side merged since this candidate was queued.
        if (!a.alive || !b.alive || a.next != c.right || a.id != c.left_id || b.id != c.right_id) continue;
        a.id = merges_.find(pair_key(c.left_id, c.right_id))->second.merged_id;
        b.alive = false;
        a.next = b.next;
        if (b.next >= 0) syms[size_t(b.next)].prev = c.left;
        consider(a.prev, c.left);
        consider(c.left, a.next);
    }
    for (const Sym& s : syms)
        if (s.alive) out.push_back(s.id);
}

}  // namespace kv
