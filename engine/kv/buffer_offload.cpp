// Offloaded placement (seed 004, keys_values --kv_cache.cpu_offload): every layer's buffer
// state is parked in a host pool (category kv_offload) and only the layer being computed is
// resident on the device (category kv_cache). With the driver's cell -> layer -> chunk order
// that is one swap per (cell, layer). Results are bit-identical to the resident buffer: the
// same bytes move back and forth. On the CPU backend the copies are plain memcpys; the swap is
// synchronous on every backend (no copy/compute overlap yet).
#include "buffer_common.h"
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
        if (sh_->resident == this) sh_->resident = nullptr;
    }
    std::string name() const override { return inner_->name() + "+offload"; }
    void allocate(int64_t B) override {
        make_resident();
        inner_->allocate(B);
    }
    bool allocated() const override { return inner_->allocated() || !host_.empty(); }
    void release() override {
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
    std::vector<float> quant_errors(const Tensor& k, const Tensor& v) override { return inner_->quant_errors(k, v); }
    void flush() override {
        if (sh_->resident == this) write_back();
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
        if (sh_->resident == this) return;
        if (sh_->resident) sh_->resident->write_back();
        KV_TRACE_SPAN(trace::SpanCategory::IO, "offload restore", .layer = int(p_.layer));
        std::vector<Tensor*> st = inner_->storage_tensors();
        for (size_t i = 0; i < st.size() && i < host_.size(); ++i) {
            if (!host_[i].defined()) continue;
            *st[i] = Tensor::empty(host_[i].shape(), host_[i].dtype(),
                                   {p_.device, MemCategory::KV_CACHE, str("layer ", p_.layer, " resident state ", i)});
            st[i]->copy_from(host_[i]);
        }
        sh_->resident = this;
    }

    std::unique_ptr<KVBuffer> inner_;
    BufferParams p_;
    std::shared_ptr<BufferShared> sh_;
    std::vector<Tensor> host_;  // parked copies of the inner storage tensors
};

}  // namespace

std::unique_ptr<KVBuffer> make_offload_buffer(std::unique_ptr<KVBuffer> inner, const BufferParams& p,
                                              std::shared_ptr<BufferShared> shared) {
    return std::make_unique<OffloadBuffer>(std::move(inner), p, std::move(shared));
}

}  // namespace kv
