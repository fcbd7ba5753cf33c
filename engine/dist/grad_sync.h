// Gradient all-reduce for data parallelism: the trainable parameters' gradients packed into
// buckets (as PyTorch DDP buckets them, 25 MiB by default), one all-reduce per bucket, unpacked
// back. Buckets live where the backend reduces: on the gradients' device for nccl, in host
// memory otherwise. Not overlapped with the backward pass: gradients accumulate over the
// step's micro-batches, so only the last one's backward could overlap (docs/DISTRIBUTED.md).
#pragma once

#include <cstdint>
#include <vector>

#include "communicator.h"
#include "engine/core/tensor.h"

namespace kv::dist {

struct GradSyncStats {
    double seconds = 0;     // wall time of the step's collectives (packing included)
    size_t bytes = 0;       // gradient bytes reduced per rank
    int64_t buckets = 0;
};

class GradSync {
   public:
    // `grads`: contiguous f32/f64 tensors, the same list (names, shapes, order) on every rank.
    GradSync(Communicator& comm, std::vector<Tensor*> grads, size_t bucket_bytes);
    // Sums every gradient over the ranks, in place.
    GradSyncStats allreduce();

   private:
    struct Bucket {
        DType dtype;
        std::vector<Tensor*> members;
        int64_t elements = 0;
        Tensor buffer;  // allocated on first use
    };
    Communicator& comm_;
    std::vector<Bucket> buckets_;
    bool device_buffers_ = false;
};

// FNV-1a over the raw bytes of the tensors (host copies of device tensors): identical weights
// and optimizer state give identical checksums on every rank.
uint64_t checksum_tensors(const std::vector<const Tensor*>& tensors);

// Throws DistError when the ranks' checksums differ, naming the first rank that differs from
// rank 0 and what was compared.
void check_identical(Communicator& comm, uint64_t checksum, const std::string& what);

}  // namespace kv::dist
