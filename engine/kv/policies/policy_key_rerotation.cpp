// key-rerotation-<scorer> (kvpress' KeyRerotationPress; docs/POLICIES.md#key-rerotation): the
// wrapped policy decides which slots leave, exactly as alone; after every plan the kept keys are
// moved to contiguous RoPE positions 0..K-1 in the order of their token positions and the
// chunk's tokens continue at K, as if the evicted tokens had never been in the sequence. This
// file only keeps the RoPE position each slot's key has and hands LayerCache the shifts
// (RerotatesKeys); the turning itself is engine/kv/key_rotation.h. Token positions (masks,
// the replay log, the views) stay the tokens' own, so the wrapped policy's decisions and every
// reader of positions are unchanged; only the angles move.
#include <algorithm>

#include "engine/core/cache_name.h"
#include "engine/core/error.h"
#include "engine/kv/key_rotation.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/kv/policies/wrapped_policy.h"

namespace kv {

std::vector<PolicyInfo> positional_policies();
std::vector<PolicyInfo> h2o_policies();
std::vector<PolicyInfo> snapkv_policies();
std::vector<PolicyInfo> knorm_policies();

namespace {

class KeyRerotationPolicy final : public KVPolicy, public RerotatesKeys {
   public:
    KeyRerotationPolicy(const PolicyArgs& a, const std::string& inner_name, const char* name) : KVPolicy(a.L, a.G), name_(name) {
        KVCacheConfig c = a.cfg;
        c.name = CacheName{inner_name, a.cfg.buffer()}.text();
        inner_ = build_policy(*find_policy(inner_name), PolicyArgs{c, a.L, a.G, a.layer, a.text});
        const PolicyCapabilities& ic = inner_->capabilities();
        // The wrapper forwards the core calls only; a scorer with capabilities would lose them.
        if (ic.selects_reads || ic.reconstructs_context || ic.pooled_slots || ic.cross_layer_lengths || ic.reorders_batch ||
            ic.reads_tokens || ic.rerotates_keys)
            throw Error(str(name_, ": '", inner_name, "' has capabilities key re-rotation does not forward"));
    }
    const char* name() const override { return name_; }
    bool needs_attention_weights() const override { return inner_->needs_attention_weights(); }
    int64_t weights_query_window() const override { return inner_->weights_query_window(); }
    FeatureSet needs_features() const override { return inner_->needs_features(); }

    void reset(int64_t batch) override {
        inner_->reset(batch);
        sync();
        rope_.clear(), shift_.clear();
        qshift_ = 0;
    }
    int64_t max_forward_length() const override { return inner_->max_forward_length(); }
    void prefill(int64_t n, const InsertFeatures& f) override {
        inner_->prefill(n, f);
        sync();
        rope_ = inner_->token_positions();  // a prefill's keys are at their own positions: nothing turns
        shift_.assign(rope_.size(), 0);
        qshift_ = 0;
    }
    SlotPlan prepare(int64_t n) const override { return inner_->prepare(n); }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        inner_->apply(plan, f);
        sync();
        const std::vector<int32_t>& pos = inner_->token_positions();
        const int64_t rows = key_shift_rows();
        if (rope_.size() != pos.size()) throw Error(str(name_, ": the slot rows changed shape within a sequence"));
        shift_.assign(pos.size(), 0);
        for (int64_t r = 0; r < rows; ++r) rerotate_row(plan, r, pos.data() + r * L_, rope_.data() + r * L_, L_, shift_.data() + r * L_);
        qshift_ = query_shift(pos, rows, L_, plan.input_pos);
    }
    void update(const std::vector<float>& w, int64_t n) override { inner_->update(w, n); }

    bool per_row_positions() const override { return inner_->per_row_positions(); }
    const std::vector<int32_t>& token_positions() const override { return inner_->token_positions(); }
    std::vector<float> slot_scores() const override { return inner_->slot_scores(); }

    const std::vector<int32_t>& key_shifts() const override { return shift_; }
    int64_t key_shift_rows() const override { return inner_->per_row_positions() ? B_ * G_ : 1; }
    int64_t chunk_query_shift() const override { return qshift_; }

   private:
    void sync() { B_ = inner_->batch(), T_ = inner_->current_length(), P_ = inner_->input_pos(); }

    const char* name_;
    std::unique_ptr<KVPolicy> inner_;
    std::vector<int32_t> rope_;   // (rows, L) the RoPE position each slot's key has now, -1 empty
    std::vector<int32_t> shift_;  // (rows, L) how far the last call turned it
    int64_t qshift_ = 0;
};

PolicyInfo rerotation_of(const std::vector<PolicyInfo>& file, const char* inner, const char* name, const char* summary) {
    const PolicyInfo* in = &wrapped_policy(file, inner, name);
    PolicyInfo out;
    out.name = name;
    out.summary = summary;
    out.needs_attention_weights = in->needs_attention_weights;
    // The keys are turned in place after every chunk: each turn of a quantized code would add its
    // rounding again, so only full-precision storage.
    out.buffers = {"default", "f32", "bf16", "f16"};
    out.uses = in->uses;
    out.required = in->required;
    out.doc_anchor = "docs/POLICIES.md#key-rerotation";
    return out;
}

}  // namespace

std::vector<PolicyInfo> key_rerotation_policies() {
    std::vector<PolicyInfo> out;
    out.push_back(rerotation_of(positional_policies(), "streaming", "key-rerotation-streaming",
                                "StreamingLLM with its cache positions: sinks + recent window, kept keys re-rotated to contiguous positions"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
        return std::make_unique<KeyRerotationPolicy>(a, "streaming", "key-rerotation-streaming");
    };
    out.push_back(rerotation_of(snapkv_policies(), "snapkv", "key-rerotation-snapkv",
                                "SnapKV with the kept keys re-rotated to contiguous positions (kvpress' KeyRerotationPress)"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
        return std::make_unique<KeyRerotationPolicy>(a, "snapkv", "key-rerotation-snapkv");
    };
    out.push_back(rerotation_of(h2o_policies(), "h2o", "key-rerotation-h2o",
                                "H2O with the kept keys re-rotated to contiguous positions"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
        return std::make_unique<KeyRerotationPolicy>(a, "h2o", "key-rerotation-h2o");
    };
    out.push_back(rerotation_of(knorm_policies(), "knorm", "key-rerotation-knorm",
                                "Knorm with the kept keys re-rotated to contiguous positions (kvpress' leaderboard pairing)"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
        return std::make_unique<KeyRerotationPolicy>(a, "knorm", "key-rerotation-knorm");
    };
    return out;
}

}  // namespace kv
