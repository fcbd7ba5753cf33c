// Host-side checkpoints of the gradient pipeline (reference §9.2-§9.3): layer inputs and
// head-gradient slots per cell, and KV states at cell starts, optionally quantized. Each
// E-vector is split into two halves that are one quantization block each (the reference's
// "G = 1, D = E/2" trick), so q8/q4 checkpoints keep per-token ranges.
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/common/quant_formats.h"

namespace kv {

class CheckpointFormat {
 public:
    // "default" (the activation dtype, no quantization), "q8", "q4".
    explicit CheckpointFormat(const std::string& name);
    bool quantized() const { return quantized_; }
    const std::string& name() const { return name_; }
    // x (..., C) on any device -> stored copy on `host` in category `cat`.
    Tensor store(const Tensor& x, Device host, MemCategory cat, const std::string& label) const;
    // Stored copy -> values (..., C) in `dtype` on `device` (category `cat`).
    Tensor load(const Tensor& stored, const Shape& shape, DType dtype, Device device, MemCategory cat,
                const std::string& label) const;
    // Stored bytes per value vector of C elements.
    size_t bytes_per_vector(int64_t C, DType dtype) const;

 private:
    std::string name_;
    bool quantized_ = false;
    QuantFormat format_ = QuantFormat::Q8;
};

}  // namespace kv
