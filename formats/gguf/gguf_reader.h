// A GGUF file opened for loading: memory-mapped, parsed and validated once, then tensors handed
// out as kv::Tensor in PyTorch order — dequantized to f32/bf16, or zero-copy views of the
// mapping when no conversion is needed. Knows nothing about model architectures (gguf_model.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "formats/gguf/gguf_parse.h"
#include "kernels/common/packed_blocks.h"

namespace kv {

// One tensor to load in a batch (see GgufReader::load_batch).
struct GgufLoadJob {
    const GgufTensorInfo* info = nullptr;
    DType dtype = DType::F32;        // F32 or BF16
    bool zero_copy = true;
    std::vector<int64_t> row_map;    // empty, or a permutation of the ggml rows (see load)
    // Packed: keep the blocks as stored (u8 [rows, blocks per row, block bytes], see
    // gguf_packed_format); only for types gguf_packed_format knows. Rows are copied (row_map
    // applies), never converted.
    bool packed = false;
    // When defined: written into this (contiguous, the result's shape and dtype) instead of a
    // fresh allocation, so callers can load several tensors into one stacked buffer without a
    // second copy (the result is then a view of it).
    Tensor dst;
    // Once copied or converted, drop the source bytes' file pages from this process's resident
    // set (madvise MADV_DONTNEED; the mapping stays valid and re-reads the file if touched).
    // Otherwise, while any zero-copy tensor keeps the mapping alive, every page the load read
    // stays in RSS (the whole file: ~94 MiB for SmolLM2 Q4_1). Only for a tensor loaded once:
    // pages an earlier zero-copy view of the same tensor wrote to would be lost.
    bool release_source = false;
};

// The packed format a ggml type is kept in by GgufLoadJob::packed; NONE for plain types.
PackedFormat gguf_packed_format(GgmlType t);

class GgufReader {
   public:
    // Maps `path` and parses it; throws kv::Error naming the path for missing, unreadable or
    // malformed files. The file is opened read-only and mapped copy-on-write (MAP_PRIVATE), so
    // the file itself is never modified even if a zero-copy tensor is written to.
    explicit GgufReader(const std::string& path);

    const GgufFile& file() const { return file_; }
    const std::string& path() const { return file_.source; }
    // Raw bytes of a tensor's data inside the mapping (info.nbytes long).
    const uint8_t* data(const GgufTensorInfo& info) const { return base_ + info.file_offset; }
    // Keeps the mapping alive (what zero-copy tensors hold on to).
    const std::shared_ptr<void>& mapping() const { return mapping_; }

    // The tensor `name` with shape info.torch_shape() in `dtype` (F32 or BF16). F32 data read as
    // F32 and BF16 data read as BF16 are views of the mapping when `zero_copy` is true and the
    // data is aligned; everything else is converted into fresh memory. `row_map` (optional, one
    // entry per ggml row) sends source row r to destination row row_map[r]. Throws kv::Error for
    // unknown names and types kvlab cannot dequantize.
    Tensor load(const std::string& name, DType dtype = DType::F32, bool zero_copy = true,
                const int64_t* row_map = nullptr) const;
    Tensor load(const GgufTensorInfo& info, DType dtype = DType::F32, bool zero_copy = true,
                const int64_t* row_map = nullptr) const;

    // Many tensors at once: all checks first, allocations on the calling thread (so they land
    // in its memory tracker), then one parallel loop over row chunks of every tensor — one
    // OpenMP region instead of one per tensor, which matters on busy shared machines.
    std::vector<Tensor> load_batch(const std::vector<GgufLoadJob>& jobs) const;

   private:
    GgufFile file_;
    std::shared_ptr<void> mapping_;
    const uint8_t* base_ = nullptr;
};

}  // namespace kv
