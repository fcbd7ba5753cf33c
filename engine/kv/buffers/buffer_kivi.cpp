// KIVI buffers (kivi2, kivi4; Liu et al. 2024, "KIVI: a tuning-free asymmetric 2bit
// quantization for KV cache"): keys quantized per channel over groups of S slots, values per
// token over groups of VG = min(S, D) channels, the most recent tokens in full precision
// (layout: kernels/common/kivi_math.h). Attention reads the packed bytes directly
// (ops::sdpa_kivi_, SDPA_KIVI): nothing is dequantized into a copy of the cache.
//
// Composing with eviction. Policies write tokens into any slot, so "the residual window" is
// kept per slot group: a group is full precision (a block of the residual pool) while it
// holds one of the R most recently written tokens of its (batch row, head), or is not full;
// otherwise it is packed. Writing into a packed group unpacks it (its other tokens keep their
// dequantized values; they are quantized again, with new group minima, when it is packed
// next). With appends only (dense, lastrec, streaming) this is KIVI's scheme exactly. At most
// ceil(R/S) + 1 groups per row stay full precision: past that the group with the oldest
// newest token is packed early (scattered writes of an eviction policy), so the residual
// pool is fixed: B G (ceil(R/S) + 2) blocks of S slots (one more while a token is written).
//
// Memory: codes in kv_cache, f16 scales and minima in kv_quant_scales, the residual pool and
// its group map in kv_residual. The packed storage covers all L slots from the first prefill.
// Host-side packing: CPU tensors only (the CUDA backend has the attention kernel, not the
// packing; make_kivi_buffer says so).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/kv/buffers/buffer_common.h"
#include "engine/telemetry/trace.h"
#include "kernels/common/kivi_math.h"

namespace kv {

namespace {

class KiviBuffer final : public KVBuffer {
   public:
    KiviBuffer(const KVCacheConfig& cfg, const BufferParams& p, int bits)
        : p_(p), bits_(bits), S_(cfg.kivi_group_size), R_(cfg.kivi_residual) {
        NG_ = (p.L + S_ - 1) / S_;
        VG_ = kivi_value_group(S_, p.D);
        KB_ = S_ * bits_ / 8;
        VB_ = p.D * bits_ / 8;
        cap_ = (R_ + S_ - 1) / S_ + 1;
        res_dtype_ = p.act_dtype == DType::F64 ? DType::F64 : DType::F32;
    }
    std::string name() const override { return str("kivi", bits_); }
    void allocate(int64_t B) override {
        if (kc_.defined() && kc_.size(0) >= B) return;
        const std::string l = str("layer ", p_.layer, " ");
        const Device dev = p_.device;
        kc_ = Tensor::zeros({B, p_.G, NG_, p_.D, KB_}, DType::U8, {dev, MemCategory::KV_CACHE, l + "keys (" + name() + " codes)"});
        ks_ = Tensor::zeros({B, p_.G, NG_, p_.D, 2}, DType::F16, {dev, MemCategory::KV_QUANT_SCALES, l + "key scales (" + name() + ")"});
        vc_ = Tensor::zeros({B, p_.G, p_.L, VB_}, DType::U8, {dev, MemCategory::KV_CACHE, l + "values (" + name() + " codes)"});
        vs_ = Tensor::zeros({B, p_.G, p_.L, p_.D / VG_, 2}, DType::F16,
                            {dev, MemCategory::KV_QUANT_SCALES, l + "value scales (" + name() + ")"});
        map_ = Tensor::full({B, p_.G, NG_}, DType::I32, -1.0, {dev, MemCategory::KV_RESIDUAL, l + "residual group map (" + name() + ")"});
        grow_pool(B * p_.G * (cap_ + 1));  // settle() after every token keeps a row at <= cap + 1
        Bcap_ = B;
    }
    bool allocated() const override { return kc_.defined(); }
    void release() override {
        kc_ = ks_ = vc_ = vs_ = map_ = res_ = Tensor();
        free_.clear();
        open_.clear();
        Bcap_ = 0;
    }
    void prefill(const Tensor& k, const Tensor& v) override {
        B_ = k.size(0);
        allocate(B_);
        reset_state();
        SlotPlan plan;
        plan.n = k.size(2);
        plan.rows = 1;
        for (int64_t t = 0; t < plan.n; ++t) plan.targets.push_back(int32_t(t));
        write(plan, k, v);
    }
    void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) override {
        KV_TRACE_SPAN(trace::SpanCategory::QUANTIZE, "kivi write", .layer = int(p_.layer));
        const int64_t G = p_.G, D = p_.D, n = plan.n;
        const std::vector<double> kx = k.to_f64_vector(), vx = v.to_f64_vector();  // (B, G, n, D)
        std::vector<double> mk, mv;  // moved contents, read before anything is written
        if (plan.moves) {
            mk.resize(size_t(B_ * G * plan.moves * D));
            mv.resize(mk.size());
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t g = 0; g < G; ++g)
                    for (int64_t m = 0; m < plan.moves; ++m) {
                        const int32_t from = plan.move_from[size_t(plan_row(plan, b, g) * plan.moves + m)];
                        read_slot(b, g, from, &mk[size_t(((b * G + g) * plan.moves + m) * D)], &mv[size_t(((b * G + g) * plan.moves + m) * D)]);
                    }
        }
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t g = 0; g < G; ++g) {
                const int64_t row = b * G + g;
                for (int64_t m = 0; m < plan.moves; ++m) {
                    const int32_t to = plan.move_to[size_t(plan_row(plan, b, g) * plan.moves + m)];
                    put_slot(b, g, to, &mk[size_t((row * plan.moves + m) * D)], &mv[size_t((row * plan.moves + m) * D)]);
                    settle(b, g);
                }
                for (int64_t t = 0; t < n; ++t) {
                    const int32_t s = plan.targets[size_t(plan_row(plan, b, g) * n + t)];
                    put_slot(b, g, s, &kx[size_t((row * n + t) * D)], &vx[size_t((row * n + t) * D)]);
                    settle(b, g);
                }
            }
    }
    std::pair<Tensor, Tensor> read(int64_t T) override {
        // For callers that need plain K/V (attention itself never calls this).
        Tensor K = Tensor::empty({B_, p_.G, T, p_.D}, res_dtype_, {p_.device, MemCategory::WORKSPACE, "kivi dequantized read"});
        Tensor V = Tensor::empty(K.shape(), res_dtype_, {p_.device, MemCategory::WORKSPACE, "kivi dequantized read"});
        std::vector<double> kr(size_t(p_.D)), vr(size_t(p_.D)), ka(size_t(B_ * p_.G * T * p_.D)), va(ka.size());
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t g = 0; g < p_.G; ++g)
                for (int64_t s = 0; s < T; ++s) {
                    read_slot(b, g, int32_t(s), kr.data(), vr.data());
                    std::copy(kr.begin(), kr.end(), ka.begin() + ((b * p_.G + g) * T + s) * p_.D);
                    std::copy(vr.begin(), vr.end(), va.begin() + ((b * p_.G + g) * T + s) * p_.D);
                }
        K.copy_from(Tensor::from_f64(K.shape(), ka, DType::F64, {p_.device, MemCategory::WORKSPACE, "kivi dequantized read"}));
        V.copy_from(Tensor::from_f64(V.shape(), va, DType::F64, {p_.device, MemCategory::WORKSPACE, "kivi dequantized read"}));
        return {K, V};
    }
    bool fused_attention() const override { return true; }
    void attend(Tensor& y, const Tensor& q, int64_t T, const Tensor& kpos, const Tensor& qpos, float scale, Tensor* wsum,
                int window) override {
        (void)T;  // kpos holds T slots
        Tensor kc = kc_.slice(0, 0, B_), ks = ks_.slice(0, 0, B_), vc = vc_.slice(0, 0, B_), vs = vs_.slice(0, 0, B_),
               map = map_.slice(0, 0, B_);
        ops::KiviCacheViews views{&kc, &ks, &vc, &vs, &res_, &map, bits_, int(S_)};
        ops::sdpa_kivi_(y, q, views, kpos, qpos, scale, window, wsum);
    }
    // |k - deq(q(k))| + |v - deq(q(v))| per token: values exactly as they will be stored; keys
    // per channel over groups of S tokens of this chunk (a decode step's single key has none:
    // its group forms later).
    std::vector<float> quant_errors(const Tensor& k, const Tensor& v) override {
        const int64_t B = k.size(0), G = k.size(1), n = k.size(2), D = p_.D;
        const std::vector<float> kx = k.to_f32_vector(), vx = v.to_f32_vector();
        std::vector<float> err(size_t(B * G * n), 0.0f);
        std::vector<uint8_t> codes(size_t(std::max(VB_, KB_ * D)));
        std::vector<uint16_t> sc(size_t(2 * D));
        for (int64_t r = 0; r < B * G; ++r) {
            for (int64_t t = 0; t < n; ++t) {
                const float* x = &vx[size_t((r * n + t) * D)];
                kivi_pack_value_row(x, D, VG_, bits_, codes.data(), sc.data());
                double e = 0;
                for (int64_t d = 0; d < D; ++d) {
                    const double dd = double(x[d]) - double(kivi_value_at(codes.data(), sc.data(), VG_, bits_, d));
                    e += dd * dd;
                }
                err[size_t(r * n + t)] += float(std::sqrt(e));
            }
            for (int64_t t0 = 0; t0 + S_ <= n; t0 += S_) {
                const float* x = &kx[size_t((r * n + t0) * D)];
                kivi_pack_key_group(x, D, S_, S_, D, bits_, codes.data(), sc.data());
                for (int64_t t = 0; t < S_; ++t) {
                    double e = 0;
                    for (int64_t d = 0; d < D; ++d) {
                        const double dd = double(x[t * D + d]) - double(kivi_key_at(codes.data(), sc.data(), S_, bits_, t, d));
                        e += dd * dd;
                    }
                    err[size_t(r * n + t0 + t)] += float(std::sqrt(e));
                }
            }
        }
        return err;
    }
    size_t bytes() const override {
        if (!kc_.defined()) return 0;
        return kc_.nbytes() + ks_.nbytes() + vc_.nbytes() + vs_.nbytes() + map_.nbytes() + res_.nbytes();
    }
    // Packed storage only (codes and scales; the residual is bounded apart).
    double bits_per_element() const override {
        const double per_slot = double(2 * VB_) + double(p_.D * 4) / double(S_) + double((p_.D / VG_) * 4);
        return 8.0 * per_slot / double(2 * p_.D);
    }
    int64_t residual_groups() const { return int64_t(res_.defined() ? res_.size(0) : 0) - int64_t(free_.size()); }
    // Beam search: row b becomes a copy of row src[b] — its codes and scales, its residual
    // groups (copied into blocks of its own) and its bookkeeping, so it packs as the source
    // would have.
    void reorder_batch(const std::vector<int32_t>& src) override {
        const int64_t G = p_.G;
        if (int64_t(src.size()) != B_)
            throw Error(str("layer ", p_.layer, " ", name(), " buffer: beam reorder of ", src.size(), " rows; expected the batch of ", B_));
        for (int32_t sb : src)
            if (sb < 0 || sb >= B_) throw Error(str("layer ", p_.layer, " ", name(), " buffer: beam source row ", sb, " is outside [0, ", B_, ")"));
        const Tensor kc = kc_.clone(), ks = ks_.clone(), vc = vc_.clone(), vs = vs_.clone(), res = res_.clone();
        const std::vector<int32_t> map(map_.data<int32_t>(), map_.data<int32_t>() + map_.numel());
        const auto open = open_;
        const auto stamp = stamp_, filled = filled_, written = written_;
        const auto slot_filled = slot_filled_;
        free_.clear();
        for (int64_t i = res_.size(0) - 1; i >= 0; --i) free_.push_back(int32_t(i));
        const size_t blk_bytes = size_t(2 * S_ * p_.D) * dtype_size(res_dtype_);
        for (int64_t b = 0; b < B_; ++b) {
            const int64_t sb = src[size_t(b)];
            for (const auto& [dst, from] : {std::pair<Tensor*, const Tensor*>{&kc_, &kc}, {&ks_, &ks}, {&vc_, &vc}, {&vs_, &vs}}) {
                const size_t row = dst->nbytes() / size_t(dst->size(0));
                std::memcpy(static_cast<char*>(dst->data_ptr()) + size_t(b) * row, static_cast<const char*>(from->data_ptr()) + size_t(sb) * row, row);
            }
            for (int64_t g = 0; g < G; ++g) {
                const int64_t r = b * G + g, sr = sb * G + g;
                for (int64_t j = 0; j < NG_; ++j) {
                    const int32_t blk = map[size_t(sr * NG_ + j)];
                    int32_t nb = -1;
                    if (blk >= 0) {
                        nb = free_.back();
                        free_.pop_back();
                        std::memcpy(static_cast<char*>(res_.data_ptr()) + size_t(nb) * blk_bytes,
                                    static_cast<const char*>(res.data_ptr()) + size_t(blk) * blk_bytes, blk_bytes);
                    }
                    *map_at(b, g, j) = nb;
                }
                open_[size_t(r)] = open[size_t(sr)];
                written_[size_t(r)] = written[size_t(sr)];
                std::copy(stamp.begin() + sr * NG_, stamp.begin() + (sr + 1) * NG_, stamp_.begin() + r * NG_);
                std::copy(filled.begin() + sr * NG_, filled.begin() + (sr + 1) * NG_, filled_.begin() + r * NG_);
                std::copy(slot_filled.begin() + sr * p_.L, slot_filled.begin() + (sr + 1) * p_.L, slot_filled_.begin() + r * p_.L);
            }
        }
    }
    // Offloading parks these (the host-side bookkeeping stays with the buffer).
    std::vector<Tensor*> storage_tensors() override { return {&kc_, &ks_, &vc_, &vs_, &map_, &res_}; }

   private:
    int64_t plan_row(const SlotPlan& plan, int64_t b, int64_t g) const { return plan.rows == 1 ? 0 : b * p_.G + g; }
    int32_t* map_at(int64_t b, int64_t g, int64_t j) const { return map_.data<int32_t>() + (b * p_.G + g) * NG_ + j; }

    void reset_state() {
        const int64_t rows = B_ * p_.G;
        std::fill(map_.data<int32_t>(), map_.data<int32_t>() + map_.numel(), -1);
        free_.clear();
        for (int64_t i = res_.size(0) - 1; i >= 0; --i) free_.push_back(int32_t(i));
        open_.assign(size_t(rows), {});
        stamp_.assign(size_t(rows * NG_), -1);
        filled_.assign(size_t(rows * NG_), 0);
        slot_filled_.assign(size_t(rows * p_.L), 0);
        written_.assign(size_t(rows), 0);
    }

    // Residual pool (P, 2, S, D); growing keeps the blocks in use.
    void grow_pool(int64_t P) {
        const int64_t old = res_.defined() ? res_.size(0) : 0;
        if (P <= old) return;
        Tensor r = Tensor::zeros({P, 2, S_, p_.D}, res_dtype_,
                                 {p_.device, MemCategory::KV_RESIDUAL, str("layer ", p_.layer, " residual window (", name(), ")")});
        if (old) {
            Tensor dst = r.slice(0, 0, old);
            dst.copy_from(res_);
        }
        res_ = r;
        for (int64_t i = P - 1; i >= old; --i) free_.insert(free_.begin(), int32_t(i));
    }
    int64_t block_off(int32_t blk, int kv, int64_t t) const { return ((int64_t(blk) * 2 + kv) * S_ + t) * p_.D; }
    double res_get(int64_t off) const {
        return res_dtype_ == DType::F64 ? res_.data<double>()[off] : double(res_.data<float>()[off]);
    }
    void res_set(int64_t off, double x) const {
        if (res_dtype_ == DType::F64) res_.data<double>()[off] = x;
        else res_.data<float>()[off] = float(x);
    }
    const uint8_t* kcodes(int64_t b, int64_t g, int64_t j) const { return kc_.data<uint8_t>() + ((b * p_.G + g) * NG_ + j) * p_.D * KB_; }
    uint16_t* kscales(int64_t b, int64_t g, int64_t j) const {
        return reinterpret_cast<uint16_t*>(ks_.data_ptr()) + ((b * p_.G + g) * NG_ + j) * p_.D * 2;
    }
    uint8_t* vcodes(int64_t b, int64_t g, int64_t s) const { return vc_.data<uint8_t>() + ((b * p_.G + g) * p_.L + s) * VB_; }
    uint16_t* vscales(int64_t b, int64_t g, int64_t s) const {
        return reinterpret_cast<uint16_t*>(vs_.data_ptr()) + ((b * p_.G + g) * p_.L + s) * (p_.D / VG_) * 2;
    }

    void read_slot(int64_t b, int64_t g, int32_t s, double* kr, double* vr) const {
        const int64_t j = s / S_, t = s % S_;
        const int32_t blk = *map_at(b, g, j);
        for (int64_t d = 0; d < p_.D; ++d) {
            if (blk >= 0) {
                kr[d] = res_get(block_off(blk, 0, t) + d);
                vr[d] = res_get(block_off(blk, 1, t) + d);
            } else {
                kr[d] = kivi_key_at(kcodes(b, g, j), kscales(b, g, j), S_, bits_, t, d);
                vr[d] = kivi_value_at(vcodes(b, g, s), vscales(b, g, s), VG_, bits_, d);
            }
        }
    }

    // Make group j of (b, g) full precision: a pool block holding its current contents.
    int32_t open_group(int64_t b, int64_t g, int64_t j) {
        int32_t* m = map_at(b, g, j);
        if (*m >= 0) return *m;
        if (free_.empty()) grow_pool(2 * res_.size(0));
        const int32_t blk = free_.back();
        free_.pop_back();
        const int64_t row = b * p_.G + g;
        for (int64_t t = 0; t < S_; ++t) {
            const int64_t s = j * S_ + t;
            const bool has = s < p_.L && slot_filled_[size_t(row * p_.L + s)];
            for (int64_t d = 0; d < p_.D; ++d) {
                res_set(block_off(blk, 0, t) + d, has ? kivi_key_at(kcodes(b, g, j), kscales(b, g, j), S_, bits_, t, d) : 0.0);
                res_set(block_off(blk, 1, t) + d, has ? kivi_value_at(vcodes(b, g, s), vscales(b, g, s), VG_, bits_, d) : 0.0);
            }
        }
        *m = blk;
        open_[size_t(row)].push_back(int32_t(j));
        return blk;
    }

    void put_slot(int64_t b, int64_t g, int32_t s, const double* kr, const double* vr) {
        if (s < 0 || s >= p_.L) throw Error(str("layer ", p_.layer, " ", name(), " buffer: slot ", s, " is outside [0, ", p_.L, ")"));
        const int64_t j = s / S_, t = s % S_, row = b * p_.G + g;
        const int32_t blk = open_group(b, g, j);
        for (int64_t d = 0; d < p_.D; ++d) {
            res_set(block_off(blk, 0, t) + d, kr[d]);
            res_set(block_off(blk, 1, t) + d, vr[d]);
        }
        if (!slot_filled_[size_t(row * p_.L + s)]) {
            slot_filled_[size_t(row * p_.L + s)] = 1;
            ++filled_[size_t(row * NG_ + j)];
        }
        stamp_[size_t(row * NG_ + j)] = written_[size_t(row)]++;
    }

    // Pack the groups of (b, g) that left the residual window; then, past the bound, the
    // group whose newest token is oldest.
    void settle(int64_t b, int64_t g) {
        const int64_t row = b * p_.G + g;
        std::vector<int32_t>& open = open_[size_t(row)];
        const int64_t horizon = written_[size_t(row)] - R_;  // tokens written before this are old
        for (size_t i = 0; i < open.size();) {
            const int32_t j = open[i];
            const int64_t slots = std::min(S_, p_.L - j * S_);
            if (filled_[size_t(row * NG_ + j)] == slots && stamp_[size_t(row * NG_ + j)] < horizon) {
                pack_group(b, g, j);
                open.erase(open.begin() + int64_t(i));
            } else {
                ++i;
            }
        }
        while (int64_t(open.size()) > cap_) {
            size_t oldest = 0;
            for (size_t i = 1; i < open.size(); ++i)
                if (stamp_[size_t(row * NG_ + open[i])] < stamp_[size_t(row * NG_ + open[oldest])]) oldest = i;
            pack_group(b, g, open[oldest]);
            open.erase(open.begin() + int64_t(oldest));
        }
    }

    void pack_group(int64_t b, int64_t g, int32_t j) {
        int32_t* m = map_at(b, g, j);
        const int32_t blk = *m;
        const int64_t row = b * p_.G + g, D = p_.D;
        int64_t n = 0;  // filled slots: a prefix of the group unless an eviction policy left holes
        for (int64_t t = 0; t < S_ && j * S_ + t < p_.L; ++t)
            if (slot_filled_[size_t(row * p_.L + j * S_ + t)]) n = t + 1;
        std::vector<float> kx(size_t(S_ * D)), vx(static_cast<size_t>(D));
        for (int64_t t = 0; t < n; ++t)
            for (int64_t d = 0; d < D; ++d) kx[size_t(t * D + d)] = float(res_get(block_off(blk, 0, t) + d));
        kivi_pack_key_group(kx.data(), D, n, S_, D, bits_, const_cast<uint8_t*>(kcodes(b, g, j)), kscales(b, g, j));
        for (int64_t t = 0; t < n; ++t) {
            for (int64_t d = 0; d < D; ++d) vx[size_t(d)] = float(res_get(block_off(blk, 1, t) + d));
            kivi_pack_value_row(vx.data(), D, VG_, bits_, vcodes(b, g, j * S_ + t), vscales(b, g, j * S_ + t));
        }
        *m = -1;
        free_.push_back(blk);
    }

    BufferParams p_;
    int bits_;
    int64_t S_, R_, NG_ = 0, VG_ = 0, KB_ = 0, VB_ = 0, cap_ = 0, B_ = 0, Bcap_ = 0;
    DType res_dtype_ = DType::F32;
    Tensor kc_, ks_, vc_, vs_, map_, res_;
    std::vector<int32_t> free_;                // free pool blocks
    std::vector<std::vector<int32_t>> open_;   // per row: full-precision groups
    std::vector<int64_t> stamp_;               // per (row, group): write count of its newest token
    std::vector<int64_t> filled_;              // per (row, group): slots ever written
    std::vector<uint8_t> slot_filled_;         // per (row, slot)
    std::vector<int64_t> written_;             // per row: tokens written since the prefill
};

}  // namespace

std::unique_ptr<KVBuffer> make_kivi_buffer(const KVCacheConfig& cfg, const BufferParams& p, int bits) {
    if (!p.device.is_cpu())
        throw Error(str("--kv_cache.name: the kivi", bits, " buffer packs on the host and runs on the CPU backend only"),
                    "use --device cpu (the CUDA backend has the SDPA_KIVI kernel, not the packing)");
    return std::make_unique<KiviBuffer>(cfg, p, bits);
}

}  // namespace kv
