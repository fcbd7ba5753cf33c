// ThinK (Xu et al. 2024, kvpress ThinKPress): keys keep only Dk = round((1 - ratio) D) of their
// D channels per (batch row, KV head), chosen once per sequence at the prefill by the channel
// score s_c = |Q_win[:, c]| |K[:, c]| (Q_win: the prefill chunk's last snapkv_window queries of
// every query head of the group; K: the prefill's keys). Stored keys are (B, G, L, Dk), values
// (B, G, L, D) as the model computed them, both in the activation dtype, plus the kept channel
// numbers (B, G, 1, Dk) int32. read() writes the kept channels into zeroed (B, G, T, D) keys, so
// any attention over them is q . k over the kept channels exactly.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/kv/buffers/buffer_common.h"

namespace kv {

namespace {

class ThinKBuffer final : public KVBuffer {
   public:
    ThinKBuffer(const KVCacheConfig& cfg, const BufferParams& p)
        : p_(p), window_(cfg.snapkv_window), Dk_(think_kept_channels(p.D, cfg.key_channel_ratio)) {}
    std::string name() const override { return "think"; }
    void allocate(int64_t B) override {
        if (K_.defined() && K_.size(0) >= B) return;
        const std::string l = str("layer ", p_.layer, " ");
        K_ = Tensor::zeros({B, p_.G, p_.L, Dk_}, p_.act_dtype, {p_.device, MemCategory::KV_CACHE, l + "pruned keys"});
        V_ = Tensor::zeros({B, p_.G, p_.L, p_.D}, p_.act_dtype, {p_.device, MemCategory::KV_CACHE, l + "values"});
        C_ = Tensor::zeros({B, p_.G, 1, Dk_}, DType::I32, {p_.device, MemCategory::KV_CACHE, l + "kept key channels"});
    }
    bool allocated() const override { return K_.defined(); }
    void release() override {
        K_ = Tensor();
        V_ = Tensor();
        C_ = Tensor();
    }
    void observe_queries(const Tensor& q) override { q_ = q; }
    bool observes_queries() const override { return true; }
    void prefill(const Tensor& k, const Tensor& v) override {
        if (!q_.defined())
            throw Error("the 'think' buffer chooses its key channels from the prefill chunk's queries; this prefill came without them",
                        "prefill a think cache through its attention (LayerCache::attend)");
        const int64_t B = k.size(0), n = k.size(2);
        if (k.size(1) != p_.G || k.size(3) != p_.D)
            throw Error(str("the 'think' buffer keeps key channels per KV head: keys of ", k.size(1), " rows of ", k.size(3),
                            " channels, expected ", p_.G, " heads of ", p_.D));
        allocate(B);
        B_ = B;
        choose_channels(k);
        q_ = Tensor();
        Tensor kd = K_.slice(0, 0, B).slice(2, 0, n), vd = V_.slice(0, 0, B).slice(2, 0, n);
        kd.copy_from(kept(k));
        vd.copy_from(v);
    }
    void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) override {
        q_ = Tensor();  // the channels stay those of the prefill
        Tensor K = K_.slice(0, 0, B_), V = V_.slice(0, 0, B_);
        apply_plan_to(K, V, plan, kept(k), v);
    }
    std::pair<Tensor, Tensor> read(int64_t T) override {
        Tensor K = Tensor::zeros({B_, p_.G, T, p_.D}, p_.act_dtype, {p_.device, MemCategory::WORKSPACE, "think keys, pruned channels zero"});
        ops::scatter_(K, 3, C_.slice(0, 0, B_).expand({B_, p_.G, T, Dk_}), K_.slice(0, 0, B_).slice(2, 0, T));
        return {K, V_.slice(0, 0, B_).slice(2, 0, T)};
    }
    size_t bytes() const override { return K_.defined() ? K_.nbytes() + V_.nbytes() + C_.nbytes() : 0; }
    // Per stored element of K and V together: (Dk + D) of 2 D elements in the activation dtype.
    double bits_per_element() const override {
        return 8.0 * double(dtype_size(p_.act_dtype)) * double(Dk_ + p_.D) / double(2 * p_.D);
    }
    std::vector<Tensor*> storage_tensors() override { return {&K_, &V_, &C_}; }
    bool per_head_rows() const override { return true; }
    int64_t slots() const override { return p_.L; }
    void resize_slots(int64_t L) override {
        const int64_t keep = std::min(L, p_.L);
        p_.L = L;
        if (!K_.defined()) return;
        Tensor K = std::move(K_), V = std::move(V_), C = std::move(C_);
        allocate(K.size(0));
        Tensor kd = K_.slice(2, 0, keep), vd = V_.slice(2, 0, keep);
        kd.copy_from(K.slice(2, 0, keep));
        vd.copy_from(V.slice(2, 0, keep));
        C_.copy_from(C);
    }
    void reorder_batch(const std::vector<int32_t>& src) override {
        const int64_t B = int64_t(src.size());
        const Tensor idx = Tensor::from_i32({B, 1, 1, 1}, src, {p_.device, MemCategory::WORKSPACE, "beam index"});
        for (Tensor* t : {&K_, &V_, &C_}) {
            Tensor x = ops::gather(t->slice(0, 0, B), 0, idx.expand({B, t->size(1), t->size(2), t->size(3)}));
            Tensor dst = t->slice(0, 0, B);
            dst.copy_from(x);
        }
    }

   private:
    // (B, G, n, Dk): the kept channels of k (B, G, n, D).
    Tensor kept(const Tensor& k) const {
        const int64_t B = k.size(0), n = k.size(2);
        return ops::gather(k, 3, C_.slice(0, 0, B).expand({B, p_.G, n, Dk_}));
    }
    // ThinK's criterion per (b, g), in f64 on the host: the squared column norms of the
    // window's queries (every query head of group g) and of the prefill's keys; the Dk largest
    // products (ties: the lower channel), stored in ascending channel order.
    void choose_channels(const Tensor& k) {
        const int64_t B = k.size(0), n = k.size(2), G = p_.G, D = p_.D, NH = q_.size(1), R = NH / G;
        const int64_t nq = q_.size(2), w = std::min(window_, nq);
        const std::vector<double> q = q_.slice(2, nq - w, nq).contiguous().to_f64_vector();  // (B, NH, w, D)
        const std::vector<double> kk = k.contiguous().to_f64_vector();                      // (B, G, n, D)
        std::vector<int32_t> chosen(size_t(B * G * Dk_));
        std::vector<double> qn(static_cast<size_t>(D)), kn(qn), s(qn);
        std::vector<int32_t> order(static_cast<size_t>(D));
        for (int64_t b = 0; b < B; ++b)
            for (int64_t g = 0; g < G; ++g) {
                std::fill(qn.begin(), qn.end(), 0.0);
                std::fill(kn.begin(), kn.end(), 0.0);
                for (int64_t h = g * R; h < (g + 1) * R; ++h)
                    for (int64_t t = 0; t < w; ++t)
                        for (int64_t c = 0; c < D; ++c) {
                            const double x = q[size_t(((b * NH + h) * w + t) * D + c)];
                            qn[size_t(c)] += x * x;
                        }
                for (int64_t t = 0; t < n; ++t)
                    for (int64_t c = 0; c < D; ++c) {
                        const double x = kk[size_t(((b * G + g) * n + t) * D + c)];
                        kn[size_t(c)] += x * x;
                    }
                for (int64_t c = 0; c < D; ++c) s[size_t(c)] = std::sqrt(qn[size_t(c)]) * std::sqrt(kn[size_t(c)]);
                std::iota(order.begin(), order.end(), 0);
                std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t c) { return s[size_t(a)] > s[size_t(c)]; });
                std::sort(order.begin(), order.begin() + Dk_);
                std::copy(order.begin(), order.begin() + Dk_, chosen.begin() + (b * G + g) * Dk_);
            }
        Tensor dst = C_.slice(0, 0, B);
        dst.copy_from(Tensor::from_i32({B, G, 1, Dk_}, chosen, {p_.device, MemCategory::WORKSPACE, "kept key channels"}));
    }

    BufferParams p_;
    int64_t window_, Dk_;
    Tensor K_, V_, C_;
    Tensor q_;  // the chunk's queries until its keys are written
    int64_t B_ = 0;
};

}  // namespace

std::unique_ptr<KVBuffer> make_think_buffer(const KVCacheConfig& cfg, const BufferParams& p) {
    if (!p.device.is_cpu())
        throw Error("--kv_cache.name: the 'think' buffer (pruned key channels) runs on the CPU backend only",
                    "use --device cpu; the CUDA backend has no think buffer");
    return std::make_unique<ThinKBuffer>(cfg, p);
}

}  // namespace kv
