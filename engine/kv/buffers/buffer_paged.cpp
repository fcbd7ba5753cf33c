// Paged storage (seed 003, vLLM-style): a layer's slots live in fixed-size blocks allocated on
// demand, so memory grows by blocks as the cache fills instead of being reserved for L up
// front. Each batch row maps its slots to (block, offset); without compaction slot s sits in
// the row's logical block s / bs at offset s % bs, as in a plain block table. Attention reads a
// contiguous gather in slot order, so its inputs — and outputs — are bit-identical to the plain
// buffer's, compacted or not.
//
// Compaction (--kv_cache.compact): eviction frees nothing until a whole block is empty, so after
// each chunk the slots no head keeps are unmapped and the kept slots of a row's emptiest blocks
// move into the free offsets of its others until the row holds ceil(kept / bs) blocks; emptied
// blocks go back to the allocator. Slot numbers (the policy's) never change, only where they sit.
#include <algorithm>
#include <map>

#include "engine/kv/buffers/buffer_common.h"

namespace kv {

namespace {

class PagedBuffer final : public KVBuffer {
   public:
    PagedBuffer(const BufferParams& p, DType dtype, int64_t bs, bool compact) : p_(p), dtype_(dtype), bs_(bs), compact_(compact) {
        nblocks_ = (p.L + bs - 1) / bs;
    }
    std::string name() const override { return str("paged(", bs_, ")"); }
    void allocate(int64_t B) override {
        if (int64_t(table_.size()) >= B) return;
        table_.resize(size_t(B), std::vector<int32_t>(size_t(nblocks_), -1));
        loc_.resize(size_t(B), std::vector<int32_t>(size_t(p_.L), -1));
    }
    bool allocated() const override { return !table_.empty(); }
    void release() override {
        table_.clear();
        loc_.clear();
        kpool_.clear();
        vpool_.clear();
        occ_.clear();
        owner_.clear();
        free_.clear();
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
                    const int32_t at = locate(b, plan.targets[size_t(row(plan, b, g) * plan.n + t)]);
                    auto& e = groups[at / bs_];
                    e.first.push_back(int32_t(at % bs_));
                    e.second.push_back(int32_t(t));
                }
                for (auto& [phys, e] : groups) {
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
        // Unmapped slots (compacted away: no head keeps them) read as zeros.
        bool holes = false;
        for (int64_t b = 0; b < B_ && !holes; ++b)
            for (int64_t s = 0; s < T && !holes; ++s) holes = loc_[size_t(b)][size_t(s)] < 0;
        const TensorOptions tag{p_.device, MemCategory::WORKSPACE, "paged gather"};
        Tensor K = holes ? Tensor::zeros({B_, p_.G, T, p_.D}, dtype_, tag) : Tensor::empty({B_, p_.G, T, p_.D}, dtype_, tag);
        Tensor V = holes ? Tensor::zeros(K.shape(), dtype_, tag) : Tensor::empty(K.shape(), dtype_, tag);
        for (int64_t b = 0; b < B_; ++b) {
            const std::vector<int32_t>& loc = loc_[size_t(b)];
            for (int64_t s = 0; s < T;) {  // runs of slots stored next to each other in one block
                const int32_t at = loc[size_t(s)];
                if (at < 0) {
                    ++s;
                    continue;
                }
                int64_t len = 1;
                while (s + len < T && (at % bs_) + len < bs_ && loc[size_t(s + len)] == at + len) ++len;
                const int64_t off = at % bs_;
                Tensor kd = K.select(0, b).slice(1, s, s + len), vd = V.select(0, b).slice(1, s, s + len);
                kd.copy_from(kpool_[size_t(at / bs_)].slice(1, off, off + len));
                vd.copy_from(vpool_[size_t(at / bs_)].slice(1, off, off + len));
                s += len;
            }
        }
        return {K, V};
    }
    bool compacts() const override { return compact_; }
    int64_t compact(const std::vector<uint8_t>& kept) override {
        if (!compact_ || table_.empty()) return 0;
        const int64_t L = p_.L;
        if (int64_t(kept.size()) != B_ * L) throw Error(str("paged compaction: ", kept.size(), " kept flags for ", B_, " x ", L, " slots"));
        int64_t moved = 0;
        for (int64_t b = 0; b < B_; ++b) {
            std::vector<int32_t>& loc = loc_[size_t(b)];
            int64_t nkept = 0;
            for (int64_t s = 0; s < L; ++s) {
                if (kept[size_t(b * L + s)]) {
                    ++nkept;
                } else if (loc[size_t(s)] >= 0) {
                    occ_[size_t(loc[size_t(s)] / bs_)][size_t(loc[size_t(s)] % bs_)] = -1;
                    loc[size_t(s)] = -1;
                }
            }
            std::vector<int32_t> mine;  // this row's blocks
            for (size_t blk = 0; blk < owner_.size(); ++blk)
                if (owner_[blk] == b && kpool_[blk].defined()) {
                    if (used(int32_t(blk)) == 0) free_block(int32_t(blk));
                    else mine.push_back(int32_t(blk));
                }
            const int64_t need = (nkept + bs_ - 1) / bs_;
            // Empty the least used blocks into the free offsets of the fullest.
            std::sort(mine.begin(), mine.end(), [&](int32_t x, int32_t y) { return used(x) < used(y) || (used(x) == used(y) && x > y); });
            size_t src = 0;
            while (int64_t(mine.size() - src) > need) {
                const int32_t from = mine[src++];
                for (int64_t o = 0; o < bs_; ++o) {
                    const int32_t s = occ_[size_t(from)][size_t(o)];
                    if (s < 0) continue;
                    int32_t to = -1;
                    for (size_t d = mine.size(); d-- > src && to < 0;) {
                        const int32_t blk = mine[d];
                        for (int64_t o2 = 0; o2 < bs_; ++o2)
                            if (occ_[size_t(blk)][size_t(o2)] < 0) {
                                to = int32_t(blk * bs_ + o2);
                                break;
                            }
                    }
                    if (to < 0) throw Error(str("paged compaction: layer ", p_.layer, " found no free offset for slot ", s));
                    Tensor dk = kpool_[size_t(to / bs_)].slice(1, to % bs_, to % bs_ + 1);
                    Tensor dv = vpool_[size_t(to / bs_)].slice(1, to % bs_, to % bs_ + 1);
                    dk.copy_from(kpool_[size_t(from)].slice(1, o, o + 1));
                    dv.copy_from(vpool_[size_t(from)].slice(1, o, o + 1));
                    occ_[size_t(to / bs_)][size_t(to % bs_)] = s;
                    loc[size_t(s)] = to;
                    ++moved;
                }
                free_block(from);
            }
        }
        return moved;
    }
    size_t bytes() const override {
        size_t n = 0;
        for (const auto& t : kpool_) n += t.defined() ? t.nbytes() : 0;
        for (const auto& t : vpool_) n += t.defined() ? t.nbytes() : 0;
        return n;
    }
    double bits_per_element() const override { return 8.0 * dtype_size(dtype_); }

   private:
    int64_t row(const SlotPlan& p, int64_t b, int64_t g) const { return p.rows == 1 ? 0 : b * p_.G + g; }
    int64_t used(int32_t blk) const {
        return int64_t(std::count_if(occ_[size_t(blk)].begin(), occ_[size_t(blk)].end(), [](int32_t s) { return s >= 0; }));
    }
    int32_t new_block(int64_t b) {
        int32_t phys;
        if (!free_.empty()) {
            phys = free_.back();
            free_.pop_back();
        } else {
            phys = int32_t(kpool_.size());
            kpool_.emplace_back();
            vpool_.emplace_back();
            occ_.emplace_back();
            owner_.push_back(0);
        }
        const std::string l = str("layer ", p_.layer, " block ", phys);
        kpool_[size_t(phys)] = Tensor::zeros({p_.G, bs_, p_.D}, dtype_, {p_.device, MemCategory::KV_CACHE, l + " keys"});
        vpool_[size_t(phys)] = Tensor::zeros({p_.G, bs_, p_.D}, dtype_, {p_.device, MemCategory::KV_CACHE, l + " values"});
        occ_[size_t(phys)].assign(size_t(bs_), -1);
        owner_[size_t(phys)] = b;
        return phys;
    }
    void free_block(int32_t blk) {
        kpool_[size_t(blk)] = Tensor();
        vpool_[size_t(blk)] = Tensor();
        for (auto& t : table_)
            for (int32_t& x : t)
                if (x == blk) x = -1;
        free_.push_back(blk);
    }
    // Where slot s of row b is stored (block * bs + offset), placing it if it has no place yet:
    // its logical block's offset s % bs when free; else (compacting: the logical block was freed,
    // or another slot moved there) any free offset of the row's blocks; else a new block.
    int32_t locate(int64_t b, int32_t s) {
        int32_t& at = loc_[size_t(b)][size_t(s)];
        if (at >= 0) return at;
        int32_t& logical = table_[size_t(b)][size_t(s / bs_)];
        int32_t blk = -1;
        int64_t off = s % bs_;
        if (logical >= 0 && occ_[size_t(logical)][size_t(off)] < 0) {
            blk = logical;
        } else if (logical >= 0 || compact_) {
            for (size_t x = 0; x < owner_.size() && blk < 0; ++x) {
                if (owner_[x] != b || !kpool_[x].defined()) continue;
                for (int64_t o = 0; o < bs_; ++o)
                    if (occ_[x][size_t(o)] < 0) {
                        blk = int32_t(x), off = o;
                        break;
                    }
            }
        }
        if (blk < 0) {
            blk = new_block(b);
            if (logical < 0) logical = blk;  // the natural place: offset s % bs
            else off = 0;
        }
        occ_[size_t(blk)][size_t(off)] = s;
        at = int32_t(blk * bs_ + off);
        return at;
    }
    Tensor slot_view(std::vector<Tensor>& pool, int64_t b, int64_t g, int32_t slot) {
        const int32_t at = locate(b, slot);
        return pool[size_t(at / bs_)].select(0, g).slice(0, at % bs_, at % bs_ + 1);
    }

    BufferParams p_;
    DType dtype_;
    int64_t bs_, nblocks_, B_ = 0;
    bool compact_ = false;
    std::vector<std::vector<int32_t>> table_;  // [b][logical block] -> the block its slots go to first (-1: none yet)
    std::vector<std::vector<int32_t>> loc_;    // [b][slot] -> block * bs + offset (-1: not stored)
    std::vector<Tensor> kpool_, vpool_;        // physical blocks (G, bs, D); undefined when freed
    std::vector<std::vector<int32_t>> occ_;    // [block][offset] -> slot stored there (-1: free)
    std::vector<int64_t> owner_;               // [block] -> batch row
    std::vector<int32_t> free_;                // freed block numbers, reused first
};

}  // namespace

std::unique_ptr<KVBuffer> make_paged_buffer(const BufferParams& p, DType dtype, int64_t block_size, bool compact) {
    return std::make_unique<PagedBuffer>(p, dtype, block_size, compact);
}

}  // namespace kv
