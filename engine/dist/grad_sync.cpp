// Bucketed gradient all-reduce and replica checksums (see grad_sync.h).
#include "grad_sync.h"

#include <cstring>

#include "engine/telemetry/trace.h"

namespace kv::dist {

GradSync::GradSync(Communicator& comm, std::vector<Tensor*> grads, size_t bucket_bytes) : comm_(comm) {
    device_buffers_ = std::string(comm.backend()) == "nccl";
    for (Tensor* g : grads) {
        if (!g->is_contiguous()) throw Error(str("gradient all-reduce: a gradient (", g->describe(), ") is not contiguous"));
        if (g->dtype() != DType::F32 && g->dtype() != DType::F64)
            throw Error(str("gradient all-reduce: gradients must be f32 or f64; got ", g->describe()));
        if (buckets_.empty() || buckets_.back().dtype != g->dtype() ||
            size_t(buckets_.back().elements + g->numel()) * dtype_size(g->dtype()) > bucket_bytes) {
            if (buckets_.empty() || !buckets_.back().members.empty()) buckets_.push_back({g->dtype(), {}, 0, {}});
            buckets_.back().dtype = g->dtype();
        }
        buckets_.back().members.push_back(g);
        buckets_.back().elements += g->numel();
    }
}

GradSyncStats GradSync::allreduce() {
    GradSyncStats st;
    static const trace::Name kAllReduce("allreduce");
    // The span and the step's all-reduce seconds come from the same two clock reads, so the
    // reported share is exactly the spans' sum over the step spans' (docs/DISTRIBUTED.md).
    const uint64_t t0 = kv::now_ns();
    for (auto& b : buckets_) {
        if (b.members.empty()) continue;
        const Device dev = device_buffers_ ? b.members.front()->device() : Device{};
        if (!b.buffer.defined())
            b.buffer = Tensor::empty({b.elements}, b.dtype, {dev, MemCategory::GRADIENTS, "gradient all-reduce bucket"});
        int64_t off = 0;
        for (Tensor* g : b.members) {
            const Tensor flat = g->reshape({g->numel()});
            b.buffer.slice(0, off, off + g->numel()).copy_from(flat.device() == dev ? flat : flat.to(dev));
            off += g->numel();
        }
        comm_.allreduce_sum(b.buffer.data_ptr(), size_t(b.elements), b.dtype == DType::F32 ? ReduceType::F32 : ReduceType::F64,
                            "gradients");
        off = 0;
        for (Tensor* g : b.members) {
            const Tensor part = b.buffer.slice(0, off, off + g->numel()).reshape(g->shape());
            g->copy_from(part.device() == g->device() ? part : part.to(g->device()));
            off += g->numel();
        }
        st.bytes += b.buffer.nbytes();
        ++st.buckets;
    }
    const uint64_t t1 = kv::now_ns();
    trace::span_complete(trace::SpanCategory::OTHER, kAllReduce, t0, t1);
    st.seconds = double(t1 - t0) * 1e-9;
    return st;
}

uint64_t checksum_tensors(const std::vector<const Tensor*>& tensors) {
    uint64_t h = 1469598103934665603ull;
    for (const Tensor* t : tensors) {
        const Tensor c = t->device().is_cpu() ? t->contiguous() : t->to(Device{}).contiguous();
        const auto* p = static_cast<const unsigned char*>(c.data_ptr());
        const size_t n = c.nbytes();
        // 8 bytes at a time: a cheap checksum, not a cryptographic one.
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t w;
            std::memcpy(&w, p + i, 8);
            h = (h ^ w) * 1099511628211ull;
        }
        for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    }
    return h;
}

void check_identical(Communicator& comm, uint64_t checksum, const std::string& what) {
    const std::vector<uint64_t> all = comm.allgather_u64(checksum, "replica checksum");
    for (size_t r = 1; r < all.size(); ++r)
        if (all[r] != all[0])
            throw DistError(str("the replicas drifted: ", what, " differ between rank 0 (checksum ", all[0], ") and rank ", r, " (", all[r],
                                "); data-parallel ranks must hold identical weights and optimizer state"),
                            "a non-deterministic collective or different inputs per rank; rerun with the same kvlab build on every host");
}

}  // namespace kv::dist
