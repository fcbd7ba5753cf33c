// Bucketed gradient all-reduce and replica checksums (see grad_sync.h).
#include "grad_sync.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "engine/telemetry/trace.h"

namespace kv::dist {

GradSync::GradSync(Communicator& comm, std::vector<Tensor*> grads, size_t bucket_bytes, std::vector<int> layers) : comm_(comm) {
    device_buffers_ = std::string(comm.backend()) == "nccl";
    if (!layers.empty() && layers.size() != grads.size())
        throw Error(str("gradient all-reduce: ", layers.size(), " layer numbers for ", grads.size(), " gradients"));
    // Top layer first, layer-less gradients last: the order the backward finishes them.
    std::vector<size_t> order(grads.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (!layers.empty())
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            const int la = layers[a] < 0 ? INT_MIN : layers[a], lb = layers[b] < 0 ? INT_MIN : layers[b];
            return la > lb;
        });
    for (size_t i : order) {
        Tensor* g = grads[i];
        const int layer = layers.empty() ? -1 : layers[i];
        if (!g->is_contiguous()) throw Error(str("gradient all-reduce: a gradient (", g->describe(), ") is not contiguous"));
        if (g->dtype() != DType::F32 && g->dtype() != DType::F64)
            throw Error(str("gradient all-reduce: gradients must be f32 or f64; got ", g->describe()));
        if (buckets_.empty() || buckets_.back().dtype != g->dtype() ||
            size_t(buckets_.back().elements + g->numel()) * dtype_size(g->dtype()) > bucket_bytes ||
            // a layer-less gradient never joins a layer's bucket (that bucket could start early)
            (layer < 0) != (buckets_.back().min_layer < 0)) {
            if (buckets_.empty() || !buckets_.back().members.empty()) buckets_.push_back({g->dtype(), {}, 0, INT_MAX, {}});
            buckets_.back().dtype = g->dtype();
            buckets_.back().min_layer = layer < 0 ? -1 : INT_MAX;
        }
        Bucket& b = buckets_.back();
        b.members.push_back(g);
        b.elements += g->numel();
        if (layer < 0) b.min_layer = -1;
        else if (b.min_layer >= 0) b.min_layer = std::min(b.min_layer, layer);
    }
}

int GradSync::layer_of_name(const std::string& name) {
    const size_t p = name.find("layers.");
    if (p == std::string::npos) return -1;
    size_t i = p + 7;
    int v = 0;
    bool digit = false;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) v = v * 10 + (name[i] - '0'), digit = true;
    return digit && i < name.size() && name[i] == '.' ? v : -1;
}

void GradSync::start(Bucket& b) {
    const Device dev = device_buffers_ ? b.members.front()->device() : Device{};
    if (!b.buffer.defined())
        b.buffer = Tensor::empty({b.elements}, b.dtype, {dev, MemCategory::GRADIENTS, "gradient all-reduce bucket"});
    int64_t off = 0;
    for (Tensor* g : b.members) {
        const Tensor flat = g->reshape({g->numel()});
        b.buffer.slice(0, off, off + g->numel()).copy_from(flat.device() == dev ? flat : flat.to(dev));
        off += g->numel();
    }
    comm_.start_allreduce_sum(b.buffer.data_ptr(), size_t(b.elements), b.dtype == DType::F32 ? ReduceType::F32 : ReduceType::F64,
                              "gradients");
}

namespace {
const trace::Name kAllReduce("allreduce");
}  // namespace

void GradSync::layers_final(int first_layer) {
    // Spans and seconds from the same clock reads (docs/DISTRIBUTED.md: the reported share is
    // the spans' sum over the step spans').
    const bool ready = next_ < buckets_.size() && buckets_[next_].min_layer >= first_layer;
    if (!ready && overlapped_ == 0) return;  // nothing to start, nothing in flight
    const uint64_t t0 = kv::now_ns();
    while (next_ < buckets_.size() && buckets_[next_].min_layer >= first_layer) {
        if (!buckets_[next_].members.empty()) start(buckets_[next_]), ++overlapped_;
        ++next_;
    }
    comm_.test_started();  // lets the started ones move while the next rows compute
    const uint64_t t1 = kv::now_ns();
    trace::span_complete(trace::SpanCategory::OTHER, kAllReduce, t0, t1);
    spent_ns_ += t1 - t0;
}

GradSyncStats GradSync::finish() {
    GradSyncStats st;
    const uint64_t t0 = kv::now_ns();
    for (; next_ < buckets_.size(); ++next_)
        if (!buckets_[next_].members.empty()) start(buckets_[next_]);
    comm_.wait_started();
    for (auto& b : buckets_) {
        if (b.members.empty()) continue;
        int64_t off = 0;
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
    st.seconds = double(spent_ns_ + (t1 - t0)) * 1e-9;
    st.overlapped = overlapped_;
    next_ = 0, overlapped_ = 0, spent_ns_ = 0;
    return st;
}

GradSyncStats GradSync::allreduce() { return finish(); }

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
