// Checkpoint formats (see checkpoint_store.h).
#include "checkpoint_store.h"

#include "engine/core/error.h"
#include "engine/ops/ops.h"

namespace kv {

CheckpointFormat::CheckpointFormat(const std::string& name) : name_(name.empty() ? "default" : name) {
    if (name_ == "default") return;
    if (name_ != "q8" && name_ != "q4")
        throw Error(str("checkpoint format '", name_, "' is not supported; expected default, q8 or q4"));
    quantized_ = true;
    format_ = name_ == "q8" ? QuantFormat::Q8 : QuantFormat::Q4;
}

namespace {
// (..., C) -> (..., 2, C/2): two quantization blocks per vector.
Shape halves(const Shape& s) {
    Shape h = s;
    const int64_t C = s.d[s.ndim - 1];
    h.d[s.ndim - 1] = 2;
    h.d[s.ndim] = C / 2;
    h.ndim = s.ndim + 1;
    return h;
}
}  // namespace

Tensor CheckpointFormat::store(const Tensor& x, Device host, MemCategory cat, const std::string& label) const {
    if (!quantized_) {
        Tensor out = Tensor::empty(x.shape(), x.dtype(), {host, cat, label});
        out.copy_from(x.device() == host ? x : x.to(host));
        return out;
    }
    const int64_t C = x.size(-1);
    if (C % 2 != 0) throw Error(str("quantized checkpoints need an even width, got ", C));
    Tensor xc = x.contiguous();
    Tensor q = ops::quantize(xc.reshape(halves(xc.shape())), format_);
    Tensor out = Tensor::empty(q.shape(), q.dtype(), {host, cat, label});
    out.copy_from(q.device() == host ? q : q.to(host));
    return out;
}

Tensor CheckpointFormat::load(const Tensor& stored, const Shape& shape, DType dtype, Device device, MemCategory cat,
                              const std::string& label) const {
    Tensor out = Tensor::empty(shape, dtype, {device, cat, label});
    if (!quantized_) {
        out.copy_from(stored.device() == device ? stored : stored.to(device));
        return out;
    }
    Tensor q = stored.device() == device ? stored : stored.to(device);
    Tensor o = out.reshape(halves(shape));
    ops::dequantize_(o, q, format_);
    return out;
}

size_t CheckpointFormat::bytes_per_vector(int64_t C, DType dtype) const {
    if (!quantized_) return size_t(C) * dtype_size(dtype);
    return 2 * quant_row_bytes(format_, C / 2);
}

}  // namespace kv
