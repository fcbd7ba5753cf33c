// quest: a read policy (Tang et al. 2024, "Quest: Query-Aware Sparsity for Efficient
// Long-Context LLM Inference"). Nothing is evicted — slots fill in position order as with
// dense — but attention after the prefill reads, per query and head, only the pages whose
// bound (kernels/common/quest_math.h) is among the top `pages`, plus the query's own page.
// The policy keeps the element-wise min and max of each page's keys per KV head. They are
// taken from the keys as the buffer stores them (after bf16 or q8 rounding), so the bound
// holds for the keys attention really reads: every write marks its pages dirty, and the next
// read refreshes exactly those pages from the slots read. Slots are never moved or
// overwritten by this policy, so writes are the only path that changes a page.
#include <algorithm>
#include <limits>

#include "engine/core/error.h"
#include "engine/model/attention.h"
#include "engine/ops/ops.h"
#include "kernels/common/quest_math.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/kv/policies/quest_policy.h"
#include "engine/kv/read_selection.h"

namespace kv {

namespace {

class QuestPolicy final : public KVPolicy, public QuestSelections, public SelectsReads, public ReordersBatch {
   public:
    QuestPolicy(int64_t L, int64_t G, int64_t page, int64_t pages) : KVPolicy(L, G), page_(page), pages_(pages) {}
    const char* name() const override { return "quest"; }
    bool per_row_positions() const override { return false; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }
    int64_t max_forward_length() const override { return L_ - T_; }
    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        pos_.assign(size_t(L_), -1);
        clean_ = 0;
        last_.clear();
        if (kmin_.defined() && kmin_.size(0) != batch) kmin_ = kmax_ = Tensor();
    }
    void prefill(int64_t n, const InsertFeatures&) override {
        write(range_plan(0, n));
        last_.clear();
    }
    SlotPlan prepare(int64_t n) const override {
        if (n < 1 || T_ + n > L_) throw_chunk_error("quest", n, L_ - T_, T_, L_, "quest never evicts and the cache is full");
        return range_plan(T_, n);
    }
    void apply(const SlotPlan& p, const InsertFeatures&) override {
        // Only in-order appends keep page j = slots [jP, jP + P) of consecutive positions.
        if (p.moves || p.rows != 1)
            throw Error(str("quest cache: a plan with ", p.moves, " moves and ", p.rows, " rows; quest only appends"));
        for (int64_t t = 0; t < p.n; ++t)
            if (p.targets[size_t(t)] != int32_t(T_ + t))
                throw Error(str("quest cache: token ", t, " of a chunk targets slot ", p.targets[size_t(t)], ", not ", T_ + t,
                                "; quest only appends"));
        write(p);
    }
    void reorder_batch(const std::vector<int32_t>& src) override {
        if (!kmin_.defined()) return;
        std::vector<int32_t> idx;
        const int64_t NP = kmin_.size(2), D = kmin_.size(3);
        for (int32_t s : src) idx.push_back(s);
        Tensor ix = Tensor::from_i32({int64_t(src.size()), 1, 1, 1}, idx, {kmin_.device(), MemCategory::WORKSPACE, "quest reorder"})
                        .expand({int64_t(src.size()), G_, NP, D});
        kmin_ = ops::gather(kmin_, 0, ix).contiguous();
        kmax_ = ops::gather(kmax_, 0, ix).contiguous();
    }

    void attend_selection(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const Tensor& kpos, const Tensor& qpos, float scale,
                          Tensor* wsum, int window) override {
        const int64_t T = K.size(2), NP = (T + page_ - 1) / page_;
        const int64_t B = q.size(0), NH = q.size(1), n = q.size(2);
        last_n_ = n, last_heads_ = NH;
        if (pages_ >= NP) {  // every page is read: this is dense attention, computed by the dense kernel
            ops::sdpa_(y, q, K, V, kpos, qpos, scale, window, wsum);
            last_.assign(size_t(B * NH * n * (pages_ + 1)), -1);
            for (int64_t r = 0; r < B * NH * n; ++r)
                for (int64_t j = 0; j < NP; ++j) last_[size_t(r * (pages_ + 1) + j)] = int32_t(j);
            return;
        }
        // SDPA_QUEST has no window; a page bound over keys the window hides would be wrong anyway.
        if (window > 0)
            throw Error(str("quest: this layer has a sliding window of ", window, " tokens, which page selection does not support"),
                        "use quest on a model without a sliding window, or another policy");
        refresh(K, T);
        Tensor sel = Tensor::empty({B, NH, n, pages_ + 1}, DType::I32, {q.device(), MemCategory::WORKSPACE, "quest selection"});
        ops::sdpa_quest_(y, q, K, V, kpos, qpos, kmin_, kmax_, scale, page_, pages_, wsum, &sel);
        const std::vector<int64_t> v = sel.to_i64_vector();
        last_.assign(v.begin(), v.end());
    }

    // The eviction map's Quest mode (telemetry score stream, no schema change): per slot, the
    // share of the last chunk's query rows of its KV group (R heads x n queries) that read
    // the slot's page. Empty after a prefill (dense attention).
    std::vector<float> slot_scores() const override {
        if (last_.empty() || last_heads_ <= 0) return {};
        const int64_t R = last_heads_ / G_, K1 = pages_ + 1, NPL = (L_ + page_ - 1) / page_;
        std::vector<float> out((size_t)(B_ * G_ * L_), 0.0f);
        std::vector<int32_t> reads((size_t)NPL);
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t g = 0; g < G_; ++g) {
                std::fill(reads.begin(), reads.end(), 0);
                for (int64_t h = g * R; h < (g + 1) * R; ++h)
                    for (int64_t i = 0; i < last_n_; ++i) {
                        const int32_t* sel = last_.data() + ((b * last_heads_ + h) * last_n_ + i) * K1;
                        for (int64_t e = 0; e < K1 && sel[e] >= 0; ++e) ++reads[size_t(sel[e])];
                    }
                float* o = out.data() + (b * G_ + g) * L_;
                for (int64_t t = 0; t < T_; ++t) o[t] = float(reads[size_t(t / page_)]) / float(R * last_n_);
            }
        return out;
    }

    // QuestSelections
    int64_t page_size() const override { return page_; }
    int64_t pages_per_query() const override { return pages_; }
    const std::vector<int32_t>& last_selection(int64_t* heads, int64_t* queries) const override {
        *heads = last_heads_, *queries = last_n_;
        return last_;
    }

   private:
    SlotPlan range_plan(int64_t start, int64_t n) const {
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.rows = 1;
        for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(start + t));
        p.length_after = std::min(L_, T_ + n);
        return p;
    }
    void write(const SlotPlan& p) {
        for (int64_t t = 0; t < p.n; ++t) pos_[size_t(p.targets[size_t(t)])] = int32_t(p.input_pos + t);
        T_ = p.length_after;
        P_ = p.input_pos + p.n;
    }
    // Pages [clean_ / P, ceil(T / P)) changed since the last read: recompute their min / max
    // from the stored keys K (B, G, T, D).
    void refresh(const Tensor& K, int64_t T) {
        const int64_t B = K.size(0), G = K.size(1), D = K.size(3), NPL = (L_ + page_ - 1) / page_;
        if (!kmin_.defined()) {
            kmin_ = Tensor::zeros({B, G, NPL, D}, DType::F32, {K.device(), MemCategory::KV_CACHE, "quest page key minima"});
            kmax_ = Tensor::zeros({B, G, NPL, D}, DType::F32, {K.device(), MemCategory::KV_CACHE, "quest page key maxima"});
        }
        const int64_t p0 = clean_ / page_, p1 = (T + page_ - 1) / page_;
        if (p1 <= p0) return;
        const int64_t t0 = p0 * page_, nt = T - t0, np = p1 - p0;
        const std::vector<float> k = K.slice(2, t0, T).contiguous().to_f32_vector();  // (B, G, nt, D)
        std::vector<float> mn((size_t)(B * G * np * D), std::numeric_limits<float>::infinity());
        std::vector<float> mx(mn.size(), -std::numeric_limits<float>::infinity());
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t t = 0; t < nt; ++t) {
                const float* kr = k.data() + (r * nt + t) * D;
                float* a = mn.data() + (r * np + t / page_) * D;
                float* b = mx.data() + (r * np + t / page_) * D;
                for (int64_t d = 0; d < D; ++d) a[d] = std::min(a[d], kr[d]), b[d] = std::max(b[d], kr[d]);
            }
        const TensorOptions o{K.device(), MemCategory::WORKSPACE, "quest page keys"};
        Tensor dmn = kmin_.slice(2, p0, p1), dmx = kmax_.slice(2, p0, p1);
        dmn.copy_from(Tensor::from_f32({B, G, np, D}, mn, DType::F32, o));
        dmx.copy_from(Tensor::from_f32({B, G, np, D}, mx, DType::F32, o));
        clean_ = T;
    }

    int64_t page_, pages_;  // page size; pages per query by bound
    int64_t clean_ = 0;  // slots [0, clean_) are reflected in kmin_ / kmax_ (whole pages below clean_ / P)
    std::vector<int32_t> pos_;
    Tensor kmin_, kmax_;  // (B, G, ceil(L / P), D) f32
    std::vector<int32_t> last_;
    int64_t last_n_ = 0, last_heads_ = 0;
};

// The gradient replay's side of the selection: page minima / maxima of the keys in slots
// [0, T) (as the policy computes them: from the stored keys rounded to f32), then SDPA_QUEST.
class QuestReadSelection final : public ReadSelection {
   public:
    QuestReadSelection(int64_t page, int64_t pages) : page_(page), pages_(pages) {}
    bool selects(int64_t length) const override { return page_ > 0 && pages_ < (length + page_ - 1) / page_; }
    void attend(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const Tensor& kpos, const Tensor& qpos, float scale,
                std::vector<int32_t>* sel) const override {
        const int64_t B = K.size(0), G = K.size(1), T = K.size(2), D = K.size(3);
        const int64_t P = page_, NP = (T + P - 1) / P, NH = q.size(1), n = q.size(2);
        const Device device = q.device();
        const std::vector<float> k = K.contiguous().to_f32_vector();
        std::vector<float> mn((size_t)(B * G * NP * D), std::numeric_limits<float>::infinity());
        std::vector<float> mx(mn.size(), -std::numeric_limits<float>::infinity());
        for (int64_t r = 0; r < B * G; ++r)
            for (int64_t t = 0; t < T; ++t)
                for (int64_t d = 0; d < D; ++d) {
                    const float x = k[size_t((r * T + t) * D + d)];
                    const size_t at = size_t((r * NP + t / P) * D + d);
                    mn[at] = std::min(mn[at], x), mx[at] = std::max(mx[at], x);
                }
        const TensorOptions o{device, MemCategory::WORKSPACE, "quest page keys"};
        Tensor kmin = Tensor::from_f32({B, G, NP, D}, mn, DType::F32, o), kmax = Tensor::from_f32({B, G, NP, D}, mx, DType::F32, o);
        Tensor st = Tensor::empty({B, NH, n, pages_ + 1}, DType::I32, {device, MemCategory::WORKSPACE, "quest selection"});
        ops::sdpa_quest_(y, q, K, V, kpos, qpos, kmin, kmax, scale, P, pages_, nullptr, &st);
        const std::vector<int64_t> v = st.to_i64_vector();
        sel->assign(v.begin(), v.end());
    }
    // Per (b, head, query) an SDPA backward whose unselected slots are hidden behind a position
    // no query reaches. (Quadratic in calls, not in memory; the selection itself is piecewise
    // constant and has no gradient.)
    void backward(Tensor& dq, Tensor& dK, Tensor& dV, const Tensor& q, const Tensor& K, const Tensor& V, const std::vector<int32_t>& pos,
                  int64_t stride, int64_t input_pos, const Tensor& dy, float scale, const std::vector<int32_t>& sel) const override {
        const int64_t B = K.size(0), G = K.size(1), T = K.size(2);
        const int64_t NH = q.size(1), n = q.size(2), R = NH / G, K1 = pages_ + 1, P = page_;
        const Device device = q.device();
        ops::SdpaBackwardOptions o;
        o.accumulate_dk = o.accumulate_dv = true;
        std::vector<int32_t> kp((size_t)T);
        // Attention sinks (gpt-oss): each one-head call takes its head's sink logit, and its
        // gradient accumulates into that head's entry of the open scope's sink gradient.
        const Tensor* sinks = ops::AttentionSinks::current();
        Tensor* dsinks = ops::AttentionSinks::current_grad();
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h) {
                const int64_t g = h / R;
                const Tensor head_sink = sinks ? sinks->slice(0, h, h + 1) : Tensor();
                Tensor head_dsink = sinks && dsinks ? dsinks->slice(0, h, h + 1) : Tensor();
                const ops::AttentionSinks sink_scope(sinks ? &head_sink : nullptr, sinks && dsinks ? &head_dsink : nullptr);
                Tensor Kb = K.slice(0, b, b + 1).slice(1, g, g + 1);
                Tensor Vb = V.slice(0, b, b + 1).slice(1, g, g + 1);
                Tensor dKb = dK.slice(0, b, b + 1).slice(1, g, g + 1);
                Tensor dVb = dV.slice(0, b, b + 1).slice(1, g, g + 1);
                for (int64_t i = 0; i < n; ++i) {
                    std::fill(kp.begin(), kp.end(), std::numeric_limits<int32_t>::max());
                    const int32_t* s = sel.data() + ((b * NH + h) * n + i) * K1;
                    for (int64_t e = 0; e < K1 && s[e] >= 0; ++e)
                        for (int64_t t = s[e] * P; t < std::min(T, (s[e] + 1) * P); ++t) kp[size_t(t)] = pos[size_t((b * G + g) * stride + t)];
                    Tensor kpos = Tensor::from_i32({1, 1, T}, kp, {device, MemCategory::WORKSPACE, "quest slot positions"});
                    Tensor qq = q.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, i, i + 1);
                    Tensor dyy = dy.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, i, i + 1);
                    Tensor dqq = dq.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, i, i + 1);
                    ops::sdpa_backward_(dqq, dKb, dVb, qq, Kb, Vb, kpos, position_range(input_pos + i, 1, device), dyy, scale, o);
                }
            }
    }

   private:
    int64_t page_, pages_;
};

}  // namespace

bool quest_reads(const KVCacheConfig& cfg, int64_t* page, int64_t* pages) {
    if (cfg.policy() != "quest") return false;
    *page = int64_t(cfg.policy_option("quest_page_size"));
    *pages = quest_pages_for(int64_t(cfg.policy_option("quest_pages")), int64_t(cfg.policy_option("quest_token_budget")), *page);
    return true;
}

void quest_plan_lengths(const KVCacheConfig& cfg, std::vector<int64_t>& lengths) {
    if (cfg.policy() != "quest") return;
    const int64_t pre = int64_t(cfg.policy_option("quest_prefill"));
    if (pre > 0)
        for (int64_t& L : lengths) L = std::min(L, pre);
}

std::vector<PolicyInfo> quest_policies() {
    return {{.name = "quest",
             .summary = "Quest: never evicts; each query reads only its top pages by a min/max key bound (a read policy)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 int64_t page = 16, pages = 64;
                 quest_reads(a.cfg, &page, &pages);
                 return std::make_unique<QuestPolicy>(a.L, a.G, page, pages);
             },
             .needs_cache_length = false,
             .evicts = false,
             .buffers = {"default", "f32", "bf16", "f16", "q8", "q4", "nf4", "q8_0", "q4_0", "fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4", "k8v4",
                         "k8v4_0", "kfp8vfp4"},
             .options = {{.name = "quest_page_size",
                          .help = "quest: slots per page (the unit of selection; Quest uses 16)",
                          .def = 16,
                          .lo = 1,
                          .hi = 65536,
                          .integer = true},
                         {.name = "quest_pages",
                          .help = "quest: pages each query reads by bound, besides its own (0 = from quest_token_budget)",
                          .def = 0,
                          .lo = 0,
                          .hi = 1048576,
                          .integer = true},
                         {.name = "quest_token_budget",
                          .help = "quest: tokens each query reads when quest_pages is 0 (ceil(budget / page size) pages)",
                          .def = 1024,
                          .lo = 1,
                          .hi = 16777216,
                          .integer = true},
                         {.name = "quest_prefill",
                          .help = "quest: tokens of the dense first chunk in eval_long and fine-tuning (0 = the whole sequence)",
                          .def = 0,
                          .lo = 0,
                          .hi = 16777216,
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#quest",
             .plan_lengths = [](const KVCacheConfig& cfg, int64_t, std::vector<int64_t>& lengths) { quest_plan_lengths(cfg, lengths); },
             .read_selection = [](const KVCacheConfig& cfg) -> std::unique_ptr<ReadSelection> {
                 int64_t page = 0, pages = 0;
                 quest_reads(cfg, &page, &pages);
                 return std::make_unique<QuestReadSelection>(page, pages);
             }}};
}

}  // namespace kv
