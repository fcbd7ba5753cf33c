// smart-lastrec (reference §4.3): lastrec whose every batch row protects a prompt range of
// slots [ps, pe) (it may wrap) found by a regex over the decoded text — e.g. the instruction
// before "<text>" in LongBench prompts — so the question survives while the ring rolls over
// the long context. A range found in a chunk takes effect from the next chunk on.
#include <algorithm>
#include <regex>

#include "engine/core/error.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

namespace {

class SmartLastRecPolicy final : public KVPolicy, public ReadsTokens {
   public:
    SmartLastRecPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text)
        : KVPolicy(L, G), cfg_(cfg), text_(text ? *text : TextCodec{}) {
        try {
            re_ = std::regex(cfg.end_initial_regex);
        } catch (const std::regex_error& e) {
            throw Error(str("--kv_cache.end_initial_regex: '", cfg.end_initial_regex, "' is not a valid regex (", e.what(), ")"));
        }
        if (!text_.decode || !text_.encode)
            throw Error("smart-lastrec needs the model's tokenizer to read the prompt; this model has none");
    }
    const char* name() const override { return "smart-lastrec"; }
    bool per_row_positions() const override { return true; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }
    int64_t max_forward_length() const override {
        int64_t widest = 0;
        for (int64_t b = 0; b < B_; ++b) widest = std::max(widest, range_len(b));
        return T_ < L_ ? L_ - T_ : L_ - widest;
    }
    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        pos_.assign(size_t(B_ * G_ * L_), -1);
        ps_.assign(size_t(B_), 0);
        pe_.assign(size_t(B_), 0);
        known_.assign(size_t(B_), false);
        pending_.assign(size_t(B_), false);
        next_.assign(size_t(B_), 0);
    }
    void observe_tokens(const std::vector<int32_t>& ids, int64_t n) override {
        ids_ = ids;
        ids_n_ = n;
    }
    void prefill(int64_t n, const InsertFeatures&) override {
        SlotPlan p;
        p.input_pos = 0;
        p.n = n;
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(t));
        p.length_after = n;
        write(p);
        for (int64_t b = 0; b < B_; ++b) next_[size_t(b)] = n < L_ ? n : 0;
        find_ranges(0, n);
        activate_ranges();
        for (int64_t b = 0; b < B_; ++b)
            if (next_[size_t(b)] == ps_[size_t(b)] && range_len(b) > 0) next_[size_t(b)] = pe_[size_t(b)];
    }
    SlotPlan prepare(int64_t n) const override {
        if (n < 1 || n > max_forward_length())
            throw_chunk_error("smart-lastrec", n, max_forward_length(), T_, L_, "the chunk would overwrite itself or the protected range");
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.length_after = std::min(L_, T_ + n);
        if (T_ < L_) {
            p.rows = 1;
            for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(T_ + t));
            return p;
        }
        p.rows = B_ * G_;
        p.targets.resize(size_t(p.rows * n));
        for (int64_t b = 0; b < B_; ++b) {
            int64_t s = next_[size_t(b)];
            std::vector<int32_t> t((size_t)n);
            for (int64_t i = 0; i < n; ++i) {
                s = skip_protected(b, s);
                t[size_t(i)] = int32_t(s);
                s = s + 1 >= L_ ? 0 : s + 1;
            }
            for (int64_t g = 0; g < G_; ++g) std::copy(t.begin(), t.end(), p.targets.begin() + (b * G_ + g) * n);
        }
        return p;
    }
    void apply(const SlotPlan& p, const InsertFeatures&) override {
        const bool filling = T_ < L_;
        write(p);
        if (!filling) {
            for (int64_t b = 0; b < B_; ++b) {
                int64_t last = p.targets[size_t(b * G_ * p.n + p.n - 1)] + 1;
                if (last >= L_) last = ps_[size_t(b)] == 0 && range_len(b) > 0 ? pe_[size_t(b)] : 0;
                next_[size_t(b)] = skip_protected(b, last);
            }
        } else {
            for (int64_t b = 0; b < B_; ++b) next_[size_t(b)] = T_ < L_ ? T_ : skip_protected(b, 0);
        }
        find_ranges(p.input_pos, p.n);
        activate_ranges();
    }

   private:
    int64_t range_len(int64_t b) const {
        if (!known_[size_t(b)]) return 0;
        const int64_t a = ps_[size_t(b)], e = pe_[size_t(b)];
        return e >= a ? e - a : L_ - a + e;
    }
    bool is_protected(int64_t b, int64_t s) const {
        if (!known_[size_t(b)] || range_len(b) == 0) return false;
        const int64_t a = ps_[size_t(b)], e = pe_[size_t(b)];
        return e >= a ? (s >= a && s < e) : (s >= a || s < e);
    }
    int64_t skip_protected(int64_t b, int64_t s) const {
        for (int64_t k = 0; k < L_ && is_protected(b, s); ++k) s = s + 1 >= L_ ? 0 : s + 1;
        return s;
    }
    void write(const SlotPlan& p) {
        for (int64_t r = 0; r < B_ * G_; ++r) {
            const int64_t pr = p.rows == 1 ? 0 : r;
            for (int64_t t = 0; t < p.n; ++t) pos_[size_t(r * L_ + p.targets[size_t(pr * p.n + t)])] = int32_t(p.input_pos + t);
        }
        T_ = p.length_after;
        P_ = p.input_pos + p.n;
    }
    // Work out protected ranges for rows that have none yet (steps 1-4 of reference §4.3).
    void find_ranges(int64_t P, int64_t n) {
        if (ids_n_ != n || int64_t(ids_.size()) != B_ * n) return;  // no tokens observed
        const int64_t cap = std::max<int64_t>(std::min<int64_t>(n, int64_t(double(L_) * cfg_.max_initial_fraction)), 1);
        for (int64_t b = 0; b < B_; ++b) {
            if (known_[size_t(b)] || pending_[size_t(b)]) continue;
            const int32_t* row = ids_.data() + b * n;
            int64_t lp = 0;
            while (lp < n && row[lp] == cfg_.pad_id) ++lp;
            int64_t len;
            if (lp == n) {
                if (!cfg_.range_is_prefix) continue;  // try again on the next chunk
                len = n - 1;
            } else {
                std::vector<int32_t> rest(row + lp, row + n);
                const std::string text = text_.decode(rest);
                std::smatch m;
                if (std::regex_search(text, m, re_)) {
                    const size_t raw = size_t(cfg_.include_end_string ? m.position(0) + m.length(0) : m.position(0));
                    len = int64_t(text_.encode(text.substr(0, raw)).size());
                    len = std::min<int64_t>(len, int64_t(rest.size()));
                } else {
                    len = n - lp;
                }
            }
            len = std::min(len + (cfg_.range_is_prefix ? lp : 0), cap);
            int64_t ps = cfg_.range_is_prefix ? 0 : (P + lp) % L_;
            int64_t pe = ps + len;
            if (pe > L_) pe -= L_;
            found_ps_.push_back(ps), found_pe_.push_back(pe), found_b_.push_back(b);
            pending_[size_t(b)] = true;
        }
    }
    // Ranges found in a chunk protect slots from the next chunk on.
    void activate_ranges() {
        for (size_t i = 0; i < found_b_.size(); ++i) {
            const int64_t b = found_b_[i];
            ps_[size_t(b)] = found_ps_[i];
            pe_[size_t(b)] = found_pe_[i];
            known_[size_t(b)] = true;
        }
        found_b_.clear(), found_ps_.clear(), found_pe_.clear();
    }

    KVCacheConfig cfg_;
    TextCodec text_;
    std::regex re_;
    std::vector<int32_t> pos_;
    std::vector<int64_t> ps_, pe_, next_;
    std::vector<bool> known_, pending_;
    std::vector<int64_t> found_b_, found_ps_, found_pe_;
    std::vector<int32_t> ids_;
    int64_t ids_n_ = 0;
};

}  // namespace

std::vector<PolicyInfo> smart_lastrec_policies() {
    return {{.name = "smart-lastrec",
             .summary = "lastrec that protects a prompt range found by end_initial_regex (needs a tokenizer)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<SmartLastRecPolicy>(a.cfg, a.L, a.G, a.text);
             },
             .needs_text = true,
             .uses = {"end_initial_regex", "max_initial_fraction"},
             .required = {{"kv_cache.end_initial_regex", "\\n"}},
             .doc_anchor = "docs/POLICIES.md#position-policies-decisions-identical-for-every-b-g"}};
}

}  // namespace kv
