// Gradient all-reduce for data parallelism: the trainable parameters' gradients packed into
// buckets (as PyTorch DDP buckets them, 25 MiB by default), one all-reduce per bucket, unpacked
// back. Buckets live where the backend reduces: on the gradients' device for nccl, in host
// memory otherwise.
//
// Overlap with the backward pass (issue 23): buckets are filled from the top layer down, the
// order in which the gradient pipeline finishes them (phase 2 walks rows of layers top-down).
// During the step's last local micro-batch the trainer reports each finished row
// (layers_final); every bucket whose gradients all lie in finished layers is then packed and
// its all-reduce started, non-blocking, while the lower rows run their backward. finish()
// starts the rest (embeddings, final norm, head: final only at the end) and waits for all.
// Every rank starts the buckets in the same order (bucket order), whatever its share of the
// micro-batches, so the collectives match; sums are the same element-wise sums as without
// overlap, so results are bit-identical to the blocking path.
#pragma once

#include <cstdint>
#include <vector>

#include "communicator.h"
#include "engine/core/tensor.h"

namespace kv::dist {

struct GradSyncStats {
    double seconds = 0;     // wall time the step spent in GradSync (launches, packing, waiting)
    size_t bytes = 0;       // gradient bytes reduced per rank
    int64_t buckets = 0;
    int64_t overlapped = 0;  // buckets started before finish() (during the backward)
};

class GradSync {
   public:
    // `grads`: contiguous f32/f64 tensors, the same list (names, shapes, order) on every rank.
    // `layers`: the transformer layer each gradient belongs to (-1: none: embeddings, final
    // norm, head), same length; empty = no overlap information (every bucket waits for finish).
    GradSync(Communicator& comm, std::vector<Tensor*> grads, size_t bucket_bytes, std::vector<int> layers = {});
    // Sums every gradient over the ranks, in place (blocking; what finish() does when nothing
    // was started).
    GradSyncStats allreduce();
    // Overlap: the gradients of layers >= first_layer are final for this step: start the
    // all-reduce of every (next) bucket made only of them.
    void layers_final(int first_layer);
    // Starts what is left, waits for every bucket, unpacks; the step's stats.
    GradSyncStats finish();
    // Parameter layer from a tensor name ("...layers.12.self_attn..." -> 12; else -1).
    static int layer_of_name(const std::string& name);

   private:
    struct Bucket {
        DType dtype;
        std::vector<Tensor*> members;
        int64_t elements = 0;
        int min_layer = 0;  // lowest layer of its members (-1: holds a layer-less gradient)
        Tensor buffer;      // allocated on first use
    };
    void start(Bucket& b);
    Communicator& comm_;
    std::vector<Bucket> buckets_;
    bool device_buffers_ = false;
    size_t next_ = 0;  // buckets started this step
    int64_t overlapped_ = 0;
    uint64_t spent_ns_ = 0;  // this step's time in layers_final
};

// FNV-1a over the raw bytes of the tensors (host copies of device tensors): identical weights
// and optimizer state give identical checksums on every rank.
uint64_t checksum_tensors(const std::vector<const Tensor*>& tensors);

// Throws DistError when the ranks' checksums differ, naming the first rank that differs from
// rank 0 and what was compared.
void check_identical(Communicator& comm, uint64_t checksum, const std::string& what);

}  // namespace kv::dist
