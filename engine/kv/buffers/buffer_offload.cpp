// Offloaded placement (seed 004, keys_values --kv_cache.cpu_offload): every layer's buffer
// state is parked in a host pool (category kv_offload) and only the layer being computed is
// resident on the device (category kv_cache). With the driver's cell -> layer -> chunk order
// that is one swap per (cell, layer). Results are bit-identical to the resident buffer: the
// same bytes move back and forth.
// Overlap: when a layer becomes resident, the layer the cache says comes next (KVCache::attend
// hints l + 1, wrapping to 0 for the next cell or decode step) is copied back on a copy thread
// into separately allocated device tensors, while the current layer computes; its restore then
// only waits for that copy and swaps the tensors in. Parking (device -> host) stays synchronous:
// the device copy is freed right after. On CUDA the copy thread uses the backend's side stream
// (copy_h2d_side); on the CPU backend it is a memcpy on another core.
#include <cstring>
#include <future>

#include "engine/kv/buffers/buffer_common.h"
#include "engine/backend/backend_registry.h"
#include "engine/telemetry/trace.h"

namespace kv {

namespace {

class OffloadBuffer final : public KVBuffer, public WorkingBufferUser {
   public:
    OffloadBuffer(std::unique_ptr<KVBuffer> inner, const BufferParams& p, std::shared_ptr<BufferShared> sh)
        : inner_(std::move(inner)), p_(p), sh_(std::move(sh)) {
        if (inner_->storage_tensors().empty())
            throw Error(str("--kv_cache.cpu_offload: the '", inner_->name(), "' buffer cannot be offloaded (use a plain or quantized buffer)"));
    }
    ~OffloadBuffer() override {
        drop_prefetch();
        if (sh_->resident == this) sh_->resident = nullptr;
        if (sh_->next == this) sh_->next = nullptr;
    }
    std::string name() const override { return inner_->name() + "+offload"; }
    void allocate(int64_t B) override {
        make_resident();
        inner_->allocate(B);
    }
    bool allocated() const override { return inner_->allocated() || !host_.empty(); }
    void release() override {
        drop_prefetch();
        if (sh_->resident == this) sh_->resident = nullptr;
        inner_->release();
        host_.clear();
    }
    void prefill(const Tensor& k, const Tensor& v) override {
        make_resident();
        inner_->prefill(k, v);
    }
    void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) override {
        make_resident();
        inner_->write(plan, k, v);
    }
    std::pair<Tensor, Tensor> read(int64_t T) override {
        make_resident();
        return inner_->read(T);
    }
    // Buffers that attend over their own storage (KIVI) do it resident.
    bool fused_attention() const override { return inner_->fused_attention(); }
    void observe_queries(const Tensor& q) override { inner_->observe_queries(q); }
    bool observes_queries() const override { return inner_->observes_queries(); }
    bool per_head_rows() const override { return inner_->per_head_rows(); }
    void attend(Tensor& y, const Tensor& q, int64_t T, const Tensor& kpos, const Tensor& qpos, float scale, Tensor* wsum,
                int window) override {
        make_resident();
        inner_->attend(y, q, T, kpos, qpos, scale, wsum, window);
    }
    std::vector<float> quant_errors(const Tensor& k, const Tensor& v) override { return inner_->quant_errors(k, v); }
    void flush() override {
        drop_prefetch();  // the parked copy is the state; a staged one would be stale after writes elsewhere
        if (sh_->next == this) sh_->next = nullptr;
        if (sh_->resident == this) write_back();
    }

    void prefetch() override {
        if (sh_->resident == this || sh_->staged == this || host_.empty()) return;
        if (sh_->staged) static_cast<OffloadBuffer*>(sh_->staged)->drop_prefetch();
        KV_TRACE_SPAN(trace::SpanCategory::IO, "offload prefetch", .layer = int(p_.layer));
        staged_.assign(host_.size(), Tensor());
        std::vector<std::tuple<void*, const void*, size_t>> copies;
        for (size_t i = 0; i < host_.size(); ++i) {
            if (!host_[i].defined()) continue;
            // Allocated here, on the engine's thread (the tracked allocator and the timeline).
            staged_[i] = Tensor::empty(host_[i].shape(), host_[i].dtype(),
                                       {p_.device, MemCategory::KV_CACHE, str("layer ", p_.layer, " prefetched state ", i)});
            copies.emplace_back(staged_[i].data_ptr(), host_[i].data_ptr(), host_[i].nbytes());
        }
        const Device dev = p_.device;
        copy_done_ = std::async(std::launch::async, [dev, copies = std::move(copies)] {
            for (const auto& [dst, src, n] : copies) {
                if (dev.is_cpu()) std::memcpy(dst, src, n);
                else backend_for(dev).copy_h2d_side(dev.index, dst, src, n);
            }
        });
        sh_->staged = this;
    }
    size_t bytes() const override {
        size_t n = inner_->bytes();
        for (const auto& t : host_) n += t.nbytes();
        return n;
    }
    double bits_per_element() const override { return inner_->bits_per_element(); }

    // Park: persist pending working-buffer rows, copy the state to the host pool, free it here.
    void write_back() override {
        KV_TRACE_SPAN(trace::SpanCategory::IO, "offload park", .layer = int(p_.layer));
        inner_->flush();
        std::vector<Tensor*> st = inner_->storage_tensors();
        host_.resize(st.size());
        for (size_t i = 0; i < st.size(); ++i) {
            if (!st[i]->defined()) continue;
            if (!host_[i].defined() || host_[i].shape() != st[i]->shape())
                host_[i] = Tensor::empty(st[i]->shape(), st[i]->dtype(),
                                         {Device{}, MemCategory::KV_OFFLOAD, str("layer ", p_.layer, " offloaded state ", i)});
            host_[i].copy_from(*st[i]);
            *st[i] = Tensor();
        }
        if (sh_->resident == this) sh_->resident = nullptr;
    }

   private:
    void make_resident() {
        if (sh_->resident != this) {
            if (sh_->resident) sh_->resident->write_back();
            KV_TRACE_SPAN(trace::SpanCategory::IO, "offload restore", .layer = int(p_.layer));
            std::vector<Tensor*> st = inner_->storage_tensors();
            if (sh_->staged == this) {
                copy_done_.get();  // rethrows a failed copy
                for (size_t i = 0; i < st.size() && i < staged_.size(); ++i)
                    if (staged_[i].defined()) *st[i] = std::move(staged_[i]);
                staged_.clear();
                sh_->staged = nullptr;
                ++sh_->prefetch_hits;
            } else {
                for (size_t i = 0; i < st.size() && i < host_.size(); ++i) {
                    if (!host_[i].defined()) continue;
                    *st[i] = Tensor::empty(host_[i].shape(), host_[i].dtype(),
                                           {p_.device, MemCategory::KV_CACHE, str("layer ", p_.layer, " resident state ", i)});
                    st[i]->copy_from(host_[i]);
                }
                if (!host_.empty()) ++sh_->prefetch_misses;
            }
            sh_->resident = this;
        }
        // Start the next layer's copy now, so it overlaps this layer's work.
        if (KVBuffer* n = sh_->next; n && n != this) {
            sh_->next = nullptr;
            n->prefetch();
        }
    }

    // Waits for an outstanding prefetch of this layer and frees its device copy.
    void drop_prefetch() {
        if (copy_done_.valid()) copy_done_.wait();
        copy_done_ = {};
        staged_.clear();
        if (sh_->staged == this) sh_->staged = nullptr;
    }

    std::unique_ptr<KVBuffer> inner_;
    BufferParams p_;
    std::shared_ptr<BufferShared> sh_;
    std::vector<Tensor> host_;    // parked copies of the inner storage tensors
    std::vector<Tensor> staged_;  // device copies being prefetched (moved in on restore)
    std::future<void> copy_done_;
};

}  // namespace

std::unique_ptr<KVBuffer> make_offload_buffer(std::unique_ptr<KVBuffer> inner, const BufferParams& p,
                                              std::shared_ptr<BufferShared> shared) {
    return std::make_unique<OffloadBuffer>(std::move(inner), p, std::move(shared));
}

}  // namespace kv
