// Paged storage (seed 003, vLLM-style): a layer's slots live in fixed-size blocks allocated on
// demand (block table per batch row), so memory grows by blocks as the cache fills instead of
// being reserved for L up front. Attention reads a contiguous gather of the blocks, so its
// inputs — and outputs — are bit-identical to the plain buffer's.
#include <algorithm>
#include <map>

#include "buffer_common.h"

namespace kv {

namespace {

class PagedBuffer final : public KVBuffer {
   public:
    PagedBuffer(const BufferParams& p, DType dtype, int64_t bs) : p_(p), dtype_(dtype), bs_(bs) {
        nblocks_ = (p.L + bs - 1) / bs;
    }
    std::string name() const override { return str("paged(", bs_, ")"); }
    void allocate(int64_t B) override {
        if (int64_t(table_.size()) >= B) return;
        table_.resize(size_t(B), std::vector<int32_t>(size_t(nblocks_), -1));
    }
    bool allocated() const override { return !table_.empty(); }
    void release() override {
        table_.clear();
        kpool_.clear();
        vpool_.clear();
    }
    void prefill(const Tensor& k, const Tensor& v) override {
        B_ = k.size(0);
        release();
        allocate(B_);
        SlotPlan p;
        p.n = k.size(2);
        p.rows = 1;
        for (int64_t t = 0; t < p.n; ++t) p.targets.push_back(int32_t(t));
        write(p, k, v);
    }
    void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) override {
        const int64_t G = p_.G;
        // Moves read the old contents before anything is written.
        Tensor mk, mv;
        if (plan.moves) {
            mk = Tensor::empty({B_, G, plan.moves, p_.D}, dtype_, {p_.device, MemCategory::WORKSPACE, "paged move"});
            mv = Tensor::empty(mk.shape(), dtype_, {p_.device, MemCategory::WORKSPACE, "paged move"});
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t g = 0; g < G; ++g)
                    for (int64_t m = 0; m < plan.moves; ++m) {
                        const int32_t from = plan.move_from[size_t(row(plan, b, g) * plan.moves + m)];
                        Tensor dk = mk.select(0, b).select(0, g).slice(0, m, m + 1), dv = mv.select(0, b).select(0, g).slice(0, m, m + 1);
                        dk.copy_from(slot_view(kpool_, b, g, from));
                        dv.copy_from(slot_view(vpool_, b, g, from));
                    }
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t g = 0; g < G; ++g)
                    for (int64_t m = 0; m < plan.moves; ++m) {
                        const int32_t to = plan.move_to[size_t(row(plan, b, g) * plan.moves + m)];
                        Tensor dk = slot_view(kpool_, b, g, to), dv = slot_view(vpool_, b, g, to);
                        dk.copy_from(mk.select(0, b).select(0, g).slice(0, m, m + 1));
                        dv.copy_from(mv.select(0, b).select(0, g).slice(0, m, m + 1));
                    }
        }
        // New tokens, grouped by destination block: one scatter per (b, g, block).
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t g = 0; g < G; ++g) {
                std::map<int64_t, std::pair<std::vector<int32_t>, std::vector<int32_t>>> groups;  // block -> (offsets, tokens)
                for (int64_t t = 0; t < plan.n; ++t) {
                    const int32_t s = plan.targets[size_t(row(plan, b, g) * plan.n + t)];
                    auto& e = groups[s / bs_];
                    e.first.push_back(int32_t(s % bs_));
                    e.second.push_back(int32_t(t));
                }
                for (auto& [blk, e] : groups) {
                    const int32_t phys = block(b, blk);
                    const int64_t m = int64_t(e.first.size());
                    Tensor idx = Tensor::from_i32({m, 1}, e.first, {p_.device, MemCategory::WORKSPACE, "paged index"}).expand({m, p_.D});
                    Tensor tok = Tensor::from_i32({m, 1}, e.second, {p_.device, MemCategory::WORKSPACE, "paged index"}).expand({m, p_.D});
                    Tensor kb = kpool_[size_t(phys)].select(0, g), vb = vpool_[size_t(phys)].select(0, g);
                    ops::scatter_(kb, 0, idx, ops::gather(k.select(0, b).select(0, g), 0, tok));
                    ops::scatter_(vb, 0, idx, ops::gather(v.select(0, b).select(0, g), 0, tok));
                }
            }
    }
    std::pair<Tensor, Tensor> read(int64_t T) override {
        Tensor K = Tensor::empty({B_, p_.G, T, p_.D}, dtype_, {p_.device, MemCategory::WORKSPACE, "paged gather"});
        Tensor V = Tensor::empty(K.shape(), dtype_, {p_.device, MemCategory::WORKSPACE, "paged gather"});
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t i = 0; i * bs_ < T; ++i) {
                const int64_t len = std::min(bs_, T - i * bs_);
                const int32_t phys = table_[size_t(b)][size_t(i)];
                Tensor kd = K.select(0, b).slice(1, i * bs_, i * bs_ + len), vd = V.select(0, b).slice(1, i * bs_, i * bs_ + len);
                kd.copy_from(kpool_[size_t(phys)].slice(1, 0, len));
                vd.copy_from(vpool_[size_t(phys)].slice(1, 0, len));
            }
        return {K, V};
    }
    size_t bytes() const override {
        size_t n = 0;
        for (const auto& t : kpool_) n += t.nbytes();
        for (const auto& t : vpool_) n += t.nbytes();
        return n;
    }
    double bits_per_element() const override { return 8.0 * dtype_size(dtype_); }
    int64_t blocks_in_use() const { return int64_t(kpool_.size()); }

   private:
    int64_t row(const SlotPlan& p, int64_t b, int64_t g) const { return p.rows == 1 ? 0 : b * p_.G + g; }
    int32_t block(int64_t b, int64_t logical) {
        int32_t& phys = table_[size_t(b)][size_t(logical)];
        if (phys < 0) {
            phys = int32_t(kpool_.size());
            const std::string l = str("layer ", p_.layer, " block ", phys);
            kpool_.push_back(Tensor::zeros({p_.G, bs_, p_.D}, dtype_, {p_.device, MemCategory::KV_CACHE, l + " keys"}));
            vpool_.push_back(Tensor::zeros({p_.G, bs_, p_.D}, dtype_, {p_.device, MemCategory::KV_CACHE, l + " values"}));
        }
        return phys;
    }
    Tensor slot_view(std::vector<Tensor>& pool, int64_t b, int64_t g, int64_t slot) {
        return pool[size_t(block(b, slot / bs_))].select(0, g).slice(0, slot % bs_, slot % bs_ + 1);
    }

    BufferParams p_;
    DType dtype_;
    int64_t bs_, nblocks_, B_ = 0;
    std::vector<std::vector<int32_t>> table_;  // [b][logical block] -> physical block
    std::vector<Tensor> kpool_, vpool_;        // physical blocks (G, bs, D)
};

}  // namespace

std::unique_ptr<KVBuffer> make_paged_buffer(const BufferParams& p, DType dtype, int64_t block_size) {
    return std::make_unique<PagedBuffer>(p, dtype, block_size);
}

}  // namespace kv
