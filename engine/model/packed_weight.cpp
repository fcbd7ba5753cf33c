// Host-side reads of packed weights (see packed_weight.h).
#include "engine/model/packed_weight.h"

#include "engine/core/error.h"
#include "engine/model/grad_math.h"
#include "engine/ops/ops.h"

namespace kv {

void packed_rows_to_f32(const Tensor& w, int64_t r0, int64_t r1, float* dst) {
    const PackedFormat f = packed_format_of(w);
    if (f == PackedFormat::NONE) throw Error(str("packed weight: ", w.describe(), " is not a packed weight"));
    if (!w.device().is_cpu()) throw Error(str("packed weight: ", w.describe(), " is not in host memory"));
    if (!w.is_contiguous()) throw Error(str("packed weight: ", w.describe(), " is not contiguous"));
    const int64_t rows = weight_shape(w)[0];
    if (r0 < 0 || r1 > rows || r0 > r1) throw Error(str("packed weight: rows [", r0, ", ", r1, ") outside ", rows));
    const int64_t nb = w.size(1), bb = w.size(2), be = packed_block_elems(f);
    const uint8_t* base = w.data<uint8_t>();
    if (f == PackedFormat::Q4_1_R16) {  // row r is row r % 16 of group r / 16
        constexpr int G = gguf_blocks::kQ41Rows;
        uint8_t blk[20];
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t b = 0; b < nb; ++b) {
                gguf_blocks::q4_1_r16_row_block(base + (r / G * nb + b) * bb, int(r % G), blk);
                gguf_blocks::dequant_q4_1(blk, dst + ((r - r0) * nb + b) * gguf_blocks::QK);
            }
        return;
    }
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = 0; b < nb; ++b) packed_dequant_block(f, base + (r * nb + b) * bb, dst + ((r - r0) * nb + b) * be);
}

Tensor packed_to_f32(const Tensor& w, const TensorOptions& opt) {
    Tensor out = Tensor::empty(weight_shape(w), DType::F32, opt);
    packed_rows_to_f32(w, 0, weight_shape(w)[0], out.data<float>());
    return out;
}

namespace {

// The packed MATMUL (op.h): transposed = false is x @ W^T, true is x @ W.
Tensor packed_matmul(const Tensor& x, const Tensor& w, DType out_dtype, bool transposed) {
    const PackedFormat f = packed_format_of(w);
    const Shape ws = weight_shape(w);
    const int64_t in = transposed ? ws[0] : ws[1], out = transposed ? ws[1] : ws[0];
    if (x.dtype() != DType::F32 || !x.device().is_cpu())
        throw Error(str("linear: a packed ", packed_format_name(f), " weight needs f32 activations on the CPU, got ", x.describe()),
                    "run with --model.weights f32 (dequantize at load) for other precisions or devices");
    if (x.ndim() < 1 || x.size(-1) != in)
        throw Error(str("linear: input ", x.shape().str(), " does not match the packed weight [out, in] = ", ws.str(),
                        transposed ? " (input gradient: expected last dim out)" : " (expected last dim in)"));
    if (!w.is_contiguous()) throw Error(str("linear: packed weight ", w.describe(), " is not contiguous"));
    Tensor xc = x.is_contiguous() ? x : x.contiguous();
    Tensor x2 = xc.reshape({-1, in});
    Tensor y = Tensor::empty({x2.size(0), out}, DType::F32, {x.device(), MemCategory::ACTIVATIONS, {}});
    Tensor w2 = w.reshape({w.size(0), w.size(1) * w.size(2)});
    OpCall c;
    c.op = OpKind::MATMUL;
    c.dst = y.view();
    c.src[0] = x2.view();
    c.src[1] = w2.view();
    c.nsrc = 2;
    c.p.qformat = int(f);
    c.p.axis = transposed ? 1 : 0;
    ops::dispatch(c);
    Shape s = x.shape();
    s.d[s.ndim - 1] = out;
    Tensor r = y.reshape(s);
    return out_dtype == DType::F32 ? r : r.to(out_dtype);
}

}  // namespace

Tensor linear_any(const Tensor& x, const Tensor& w, DType out_dtype) {
    return is_packed(w) ? packed_matmul(x, w, out_dtype, false) : ops::linear(x, w, out_dtype);
}

Tensor linear_input_grad_any(const Tensor& dy, const Tensor& w, DType out_dtype) {
    return is_packed(w) ? packed_matmul(dy, w, out_dtype, true) : grad::mm(dy, w, out_dtype);
}

}  // namespace kv
