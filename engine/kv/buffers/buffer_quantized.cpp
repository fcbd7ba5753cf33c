// Quantized buffers (reference §3.1): each layer stores K and V as quantized rows; all layers
// share one dequantized working buffer. A layer that accesses its buffer first "associates"
// with the working buffer: the previous owner's dirty rows are re-quantized (write-back) and
// this layer's rows are dequantized. Reads and writes then act on the full-precision copy, so
// tokens written during an association stay exact until the next write-back — with the
// driver's cell -> layer -> chunk order that is once per (cell, layer), as in keys_values.
// Dirty tracking follows keys_values: at most 32 slots per index write and 0.2 L in total
// are tracked, then covered by max_num_ranges ranges of minimal total length; otherwise the
// whole buffer is written back.
//
// The deployed formats (fp8, nvfp4, mxfp4, turboquant) on the CPU with f32 activations and a
// row per head skip the working buffer: writes quantize the new rows straight into the codes,
// and attention reads the codes (quant_attention.h), as a serving engine's cache does; every
// token, the newest included, is attended in its stored precision. read() then decodes a
// copy for the callers that need plain K/V.
#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>

#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/buffers/quant_attention.h"
#include "engine/kv/kv_scales.h"
#include "engine/telemetry/trace.h"
#include "kernels/common/quant_formats.h"

namespace kv {

std::shared_ptr<BufferShared> make_buffer_shared(const KVCacheConfig&, int64_t max_L, int64_t G, int64_t D, Device device,
                                                 DType act) {
    auto s = std::make_shared<BufferShared>();
    s->device = device;
    s->act = act;
    s->max_L = max_L;
    s->G = G;
    s->D = D;
    return s;
}

namespace {

constexpr int64_t kMaxPositionsToCheck = 32;  // keys_values MAX_SIZE_POSITIONS_TO_CHECK
constexpr double kMaxTrackedFraction = 0.2;   // keys_values MAX_SLOTS_TRACKED_FRACTION

class QuantizedBuffer final : public KVBuffer, public WorkingBufferUser {
   public:
    QuantizedBuffer(const KVCacheConfig& cfg, const BufferParams& p, QuantFormat kf, QuantFormat vf, std::string name,
                    std::shared_ptr<BufferShared> sh)
        : p_(p), kf_(kf), vf_(vf), name_(std::move(name)), sh_(std::move(sh)), max_ranges_(int(cfg.max_num_ranges)) {
        // Blocks span all heads of a token when one head is too small (keys_values: D < 16)
        // or does not fit a format's block size, or when asked for one scale per token.
        over_heads_ = quant_rows_over_heads(cfg, kf, vf, p.D);
        row_ = over_heads_ ? p.G * p.D : p.D;
        gq_ = over_heads_ ? 1 : p.G;
        rbk_ = quant_row_bytes(kf, row_);
        rbv_ = quant_row_bytes(vf, row_);
        max_tracked_ = int64_t(kMaxTrackedFraction * double(p.L));
        direct_ = !over_heads_ && p.device.is_cpu() && p.act_dtype == DType::F32 && quant_attention_format(kf) &&
                  quant_attention_format(vf);
        if (direct_ && tq_codebook(kf)) klevels_ = ops::quant_levels(kf, p.D);
        if (!cfg.kv_scales.empty()) load_static_scales(cfg);
    }
    ~QuantizedBuffer() override {
        if (sh_ && sh_->owner == this) sh_->owner = nullptr;
    }
    std::string name() const override { return name_; }
    void allocate(int64_t B) override {
        if (Kq_.defined() && Kq_.size(0) >= B) return;
        const std::string l = str("layer ", p_.layer, " ");
        Kq_ = Tensor::zeros({B, gq_, p_.L, rbk_}, DType::U8, {p_.device, MemCategory::KV_CACHE, l + "keys (" + name() + ")"});
        Vq_ = Tensor::zeros({B, gq_, p_.L, rbv_}, DType::U8, {p_.device, MemCategory::KV_CACHE, l + "values (" + name() + ")"});
    }
    bool allocated() const override { return Kq_.defined(); }
    void release() override {
        if (sh_->owner == this) sh_->owner = nullptr;  // contents are discarded
        Kq_ = Tensor();
        Vq_ = Tensor();
    }
    void prefill(const Tensor& k, const Tensor& v) override {
        B_ = k.size(0);
        allocate(B_);
        if (direct_) {
            SlotPlan plan;
            plan.n = k.size(2);
            plan.rows = 1;
            for (int64_t t = 0; t < plan.n; ++t) plan.targets.push_back(int32_t(t));
            write_codes(plan, k, v);
            return;
        }
        associate();
        const int64_t n = k.size(2);
        Tensor kw = sh_->Kw.slice(0, 0, B_).slice(2, 0, n), vw = sh_->Vw.slice(0, 0, B_).slice(2, 0, n);
        kw.copy_from(k);
        vw.copy_from(v);
        mark_range(0, n);
    }
    void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) override {
        if (direct_) return write_codes(plan, k, v);
        associate();
        Tensor K = working_k(), V = working_v();
        apply_plan_to(K, V, plan, k, v);
        int64_t start = 0;
        if (plan.contiguous_range(&start)) {
            mark_range(start, start + plan.n);
        } else {
            mark_index(plan.targets, plan.n);
            if (plan.moves) mark_index(plan.move_to, plan.moves);
        }
    }
    std::pair<Tensor, Tensor> read(int64_t T) override {
        if (direct_) {  // a decoded copy for callers that need plain K/V (attention reads the codes)
            Tensor K = Tensor::empty({B_, p_.G, T, p_.D}, DType::F32, {p_.device, MemCategory::WORKSPACE, "quantized read"});
            Tensor V = Tensor::empty(K.shape(), DType::F32, {p_.device, MemCategory::WORKSPACE, "quantized read"});
            ops::dequantize_(K, Kq_.slice(0, 0, B_).slice(2, 0, T), kf_);
            ops::dequantize_(V, Vq_.slice(0, 0, B_).slice(2, 0, T), vf_);
            return {K, V};
        }
        associate();
        return {sh_->Kw.slice(0, 0, B_).slice(2, 0, T), sh_->Vw.slice(0, 0, B_).slice(2, 0, T)};
    }
    std::vector<float> quant_errors(const Tensor& k, const Tensor& v) override {
        std::vector<float> ek = row_errors(k, kf_, rbk_), ev = row_errors(v, vf_, rbv_);
        for (size_t i = 0; i < ek.size(); ++i) ek[i] += ev[i];
        return ek;
    }
    bool fused_attention() const override { return direct_; }
    void attend(Tensor& y, const Tensor& q, int64_t T, const Tensor& kpos, const Tensor& qpos, float scale, Tensor* wsum,
                int window) override {
        if (ops::AttentionSoftcap::current() != 0.0f || ops::AttentionSinks::current() || q.dtype() != DType::F32 ||
            y.dtype() != DType::F32) {  // what the code path does not implement: SDPA over a decoded copy
            auto [K, V] = read(T);
            ops::sdpa_(y, q, K, V, kpos, qpos, scale, window, wsum);
            return;
        }
        if (!q.device().is_cpu() || q.size(0) > Kq_.size(0) || T > p_.L || kpos.size(2) < T)
            throw Error(str("quantized-row attention: q ", q.shape().str(), " over ", T, " of ", p_.L, " slots, kpos ", kpos.shape().str(),
                            "; expected CPU queries of at most ", Kq_.size(0), " batch rows and positions for the slots read"));
        const int64_t B = q.size(0);
        ops::sdpa_qrows_(y, q, Kq_.slice(0, 0, B).slice(2, 0, T), Vq_.slice(0, 0, B).slice(2, 0, T), kf_, vf_, klevels_,
                         kpos.slice(2, 0, T), qpos, scale, window, wsum);
    }
    void flush() override {
        if (sh_->owner == this) {
            write_back();
            sh_->owner = nullptr;
        }
    }
    size_t bytes() const override { return Kq_.defined() ? Kq_.nbytes() + Vq_.nbytes() : 0; }
    std::vector<Tensor*> storage_tensors() override { return {&Kq_, &Vq_}; }
    double bits_per_element() const override { return 8.0 * double(rbk_ + rbv_) / double(2 * row_); }

    // Re-quantize the dirty rows of the working buffer into this layer's storage.
    void write_back() override {
        if (!Kq_.defined()) return;
        KV_TRACE_SPAN(trace::SpanCategory::QUANTIZE, "quantize (write-back)", .layer = int(p_.layer));
        std::vector<std::pair<int64_t, int64_t>> ranges;
        if (!track_) {
            ranges.push_back({0, p_.L});
        } else if (!dirty_.empty()) {
            ranges = covering_ranges(std::vector<int32_t>(dirty_.begin(), dirty_.end()), max_ranges_);
        }
        for (auto [s, e] : ranges) {
            quantize_rows(working_k().slice(2, s, e), Kq_.slice(0, 0, B_).slice(2, s, e), kf_);
            quantize_rows(working_v().slice(2, s, e), Vq_.slice(0, 0, B_).slice(2, s, e), vf_);
        }
        dirty_.clear();
        track_ = true;
    }

    // Smallest total cover of sorted slots by at most m ranges: split at the m-1 largest gaps.
    static std::vector<std::pair<int64_t, int64_t>> covering_ranges(std::vector<int32_t> s, int m) {
        std::sort(s.begin(), s.end());
        std::vector<std::pair<int64_t, size_t>> gaps;  // (gap length, index of the slot after it)
        for (size_t i = 1; i < s.size(); ++i) gaps.push_back({int64_t(s[i]) - s[i - 1] - 1, i});
        std::sort(gaps.begin(), gaps.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
        std::vector<size_t> cuts;
        for (size_t i = 0; i < gaps.size() && int(cuts.size()) < m - 1; ++i)
            if (gaps[i].first > 0) cuts.push_back(gaps[i].second);
        std::sort(cuts.begin(), cuts.end());
        std::vector<std::pair<int64_t, int64_t>> out;
        size_t begin = 0;
        for (size_t c : cuts) {
            out.push_back({s[begin], int64_t(s[c - 1]) + 1});
            begin = c;
        }
        out.push_back({s[begin], int64_t(s.back()) + 1});
        return out;
    }

   private:
    // Direct mode: the plan's moves (code rows, read before any is written), then the new
    // rows quantized into their targets.
    void write_codes(const SlotPlan& plan, const Tensor& k, const Tensor& v) {
        KV_TRACE_SPAN(trace::SpanCategory::QUANTIZE, "quantize (direct)", .layer = int(p_.layer));
        const int64_t G = p_.G, n = plan.n;
        auto row_of = [&](int64_t b, int64_t g) { return plan.rows == 1 ? 0 : b * G + g; };
        for (auto [T, rb] : {std::pair<Tensor*, int64_t>{&Kq_, rbk_}, {&Vq_, rbv_}}) {
            if (!plan.moves) break;
            uint8_t* base = T->data<uint8_t>();
            std::vector<uint8_t> tmp(size_t(plan.moves * rb));
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t g = 0; g < G; ++g) {
                    uint8_t* rows = base + (b * G + g) * p_.L * rb;
                    const int32_t* from = plan.move_from.data() + row_of(b, g) * plan.moves;
                    const int32_t* to = plan.move_to.data() + row_of(b, g) * plan.moves;
                    for (int64_t m = 0; m < plan.moves; ++m) std::memcpy(&tmp[size_t(m * rb)], rows + from[m] * rb, size_t(rb));
                    for (int64_t m = 0; m < plan.moves; ++m) std::memcpy(rows + to[m] * rb, &tmp[size_t(m * rb)], size_t(rb));
                }
        }
        if (!n) return;
        const Tensor kq = ks_.empty() ? ops::quantize(k.contiguous(), kf_) : quantize_fp8_static(k, kf_, ks_, rbk_),  // (B, G, n, rb)
                     vq = vs_.empty() ? ops::quantize(v.contiguous(), vf_) : quantize_fp8_static(v, vf_, vs_, rbv_);
        for (auto [T, src, rb] : {std::tuple<Tensor*, const Tensor*, int64_t>{&Kq_, &kq, rbk_}, {&Vq_, &vq, rbv_}}) {
            uint8_t* base = T->data<uint8_t>();
            const uint8_t* in = src->data<uint8_t>();
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t g = 0; g < G; ++g) {
                    uint8_t* rows = base + (b * G + g) * p_.L * rb;
                    const int32_t* tg = plan.targets.data() + row_of(b, g) * n;
                    for (int64_t t = 0; t < n; ++t) {
                        if (tg[t] < 0 || tg[t] >= p_.L)
                            throw Error(str("layer ", p_.layer, " ", name_, " buffer: slot ", tg[t], " is outside [0, ", p_.L, ")"));
                        std::memcpy(rows + tg[t] * rb, in + ((b * G + g) * n + t) * rb, size_t(rb));
                    }
                }
        }
    }

    // --kv_cache.kv_scales: this layer's calibrated scale per KV head for the fp8 side(s), as the
    // format's scale (the file holds E4M3's, max / 448).
    void load_static_scales(const KVCacheConfig& cfg) {
        auto is8 = [](QuantFormat f) { return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2; };
        if (!is8(kf_) && !is8(vf_))
            throw Error(str("--kv_cache.kv_scales: the '", name_, "' buffer stores no fp8 rows; expected an fp8 buffer (fp8_e4m3, fp8_e5m2, kfp8vfp4)"));
        if (!direct_)
            throw Error(str("--kv_cache.kv_scales: calibrated scales need a row per KV head on the CPU with f32 activations (layer ", p_.layer,
                            ": ", over_heads_ ? "rows span all heads (scale_granularity token, or a head size the formats cannot hold alone)"
                                              : "another device or activation dtype", ")"));
        const KvScales sc = read_kv_scales(cfg.kv_scales);
        check_kv_scales(sc, cfg.kv_scales, std::max(sc.layers, p_.layer + 1), p_.G, p_.D);
        for (int64_t g = 0; g < p_.G; ++g) {
            if (is8(kf_)) ks_.push_back(sc.k_scale(p_.layer, g) * (kf_ == QuantFormat::FP8_E5M2 ? kE4M3Max / kE5M2Max : 1.0f));
            if (is8(vf_)) vs_.push_back(sc.v_scale(p_.layer, g) * (vf_ == QuantFormat::FP8_E5M2 ? kE4M3Max / kE5M2Max : 1.0f));
        }
    }
    // (B, G, n, D) -> fp8 rows (B, G, n, D + 4) with head g's fixed scale s[g] (saturating past it).
    static Tensor quantize_fp8_static(const Tensor& x, QuantFormat f, const std::vector<float>& s, int64_t rb) {
        const int64_t B = x.size(0), G = x.size(1), n = x.size(2), D = x.size(3);
        const std::vector<float> a = x.contiguous().to_f32_vector();
        Tensor out = Tensor::empty({B, G, n, rb}, DType::U8, {x.device(), MemCategory::WORKSPACE, "fp8 rows (calibrated scales)"});
        uint8_t* o = out.data<uint8_t>();
        const bool e5 = f == QuantFormat::FP8_E5M2;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g)
                for (int64_t t = 0; t < n; ++t) {
                    const float* r = a.data() + ((b * G + g) * n + t) * D;
                    uint8_t* row = o + ((b * G + g) * n + t) * rb;
                    for (int64_t i = 0; i < D; ++i) row[i] = e5 ? f32_to_e5m2(r[i] / s[size_t(g)]) : f32_to_e4m3(r[i] / s[size_t(g)]);
                    put_f32(row + D, s[size_t(g)]);
                }
        return out;
    }

    Tensor working_k() const { return sh_->Kw.slice(0, 0, B_).slice(2, 0, p_.L); }
    Tensor working_v() const { return sh_->Vw.slice(0, 0, B_).slice(2, 0, p_.L); }

    void associate() {
        if (sh_->owner == this) return;
        if (sh_->owner) sh_->owner->write_back();
        KV_TRACE_SPAN(trace::SpanCategory::DEQUANTIZE, "dequantize (associate)", .layer = int(p_.layer));
        sh_->ensure(B_);
        dequantize_rows(Kq_.slice(0, 0, B_), working_k(), kf_);
        dequantize_rows(Vq_.slice(0, 0, B_), working_v(), vf_);
        sh_->owner = this;
        dirty_.clear();
        track_ = true;
    }
    void mark_range(int64_t s, int64_t e) {
        if (!track_) return;
        if (e - s > max_tracked_) {
            track_ = false;
            return;
        }
        for (int64_t i = s; i < e; ++i) dirty_.insert(int32_t(i));
        if (int64_t(dirty_.size()) > max_tracked_) track_ = false;
    }
    void mark_index(const std::vector<int32_t>& slots, int64_t n) {
        if (!track_) return;
        if (n > kMaxPositionsToCheck) {
            track_ = false;
            return;
        }
        dirty_.insert(slots.begin(), slots.end());  // every (b, g) entry into one slot set
        if (int64_t(dirty_.size()) > max_tracked_) track_ = false;
    }
    // (B, G, r, D) full precision -> (B, gq, r, rb) bytes.
    void quantize_rows(const Tensor& w, Tensor q, QuantFormat f) const {
        if (!over_heads_) {
            ops::quantize_(q, w, f);
            return;
        }
        const int64_t B = w.size(0), r = w.size(2);
        Tensor rows = w.permute({0, 2, 1, 3}).contiguous().reshape({B, r, row_});
        Tensor dst = q.select(1, 0);
        ops::quantize_(dst, rows, f);
    }
    void dequantize_rows(const Tensor& q, Tensor w, QuantFormat f) const {
        if (!over_heads_) {
            ops::dequantize_(w, q, f);
            return;
        }
        const int64_t B = w.size(0), r = w.size(2);
        Tensor rows = Tensor::empty({B, r, row_}, w.dtype(), {w.device(), MemCategory::WORKSPACE, "dequantize staging"});
        ops::dequantize_(rows, q.select(1, 0), f);
        w.copy_from(rows.reshape({B, r, p_.G, p_.D}).permute({0, 2, 1, 3}));
    }
    // |x - deq(q(x))| per token and head for new rows x (B, G, n, D).
    std::vector<float> row_errors(const Tensor& x, QuantFormat f, int64_t rb) const {
        const int64_t B = x.size(0), G = x.size(1), n = x.size(2);
        Tensor xf = Tensor::empty({B, G, n, p_.D}, DType::F32, {x.device(), MemCategory::WORKSPACE, "quant error"});
        xf.copy_from(x);
        Tensor q = Tensor::empty({B, gq_, n, rb}, DType::U8, {x.device(), MemCategory::WORKSPACE, "quant error"});
        quantize_rows(xf, q, f);
        Tensor d = Tensor::empty(xf.shape(), DType::F32, {x.device(), MemCategory::WORKSPACE, "quant error"});
        dequantize_rows(q, d, f);
        Tensor diff = ops::add(d, ops::scale(xf, -1.0f));
        return ops::norm_last(diff).to_f32_vector();
    }

    BufferParams p_;
    QuantFormat kf_, vf_;
    std::string name_;
    std::shared_ptr<BufferShared> sh_;
    int max_ranges_;
    bool over_heads_ = false;
    bool direct_ = false;  // codes written and attended directly (no working buffer)
    QuantLevels klevels_{};
    std::vector<float> ks_, vs_;  // calibrated fp8 scales per KV head (--kv_cache.kv_scales); empty: dynamic
    int64_t row_ = 0, gq_ = 0, rbk_ = 0, rbv_ = 0, max_tracked_ = 0, B_ = 0;
    Tensor Kq_, Vq_;
    bool track_ = true;
    std::set<int32_t> dirty_;
};

}  // namespace

std::vector<std::pair<int64_t, int64_t>> quantized_covering_ranges(const std::vector<int32_t>& slots, int m) {
    return QuantizedBuffer::covering_ranges(slots, m);
}

std::unique_ptr<KVBuffer> make_quantized_buffer(const KVCacheConfig& cfg, const BufferParams& p, QuantFormat kf, QuantFormat vf,
                                                std::string name, std::shared_ptr<BufferShared> shared) {
    return std::make_unique<QuantizedBuffer>(cfg, p, kf, vf, std::move(name), std::move(shared));
}

}  // namespace kv
