// Engine-level op wrappers: the only place that turns user mistakes (shapes, dtypes, devices)
// into messages, so kernels can assume valid calls.
//
// Index
//   [SECTION] linear algebra
//   [SECTION] elementwise
//   [SECTION] normalisation and softmax
//   [SECTION] position encoding
//   [SECTION] indexing
//   [SECTION] copies
//   [SECTION] attention
//   [SECTION] quantization
//   [SECTION] gradients
//   [SECTION] losses
//   [SECTION] optimizer
//   [SECTION] reductions

#include "ops.h"

#include "kernels/common/kivi_op.h"
#include "kernels/common/lloyd_max.h"
#include "kernels/common/qrows_op.h"
#include "kernels/common/quest_op.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"

namespace kv::ops {

namespace {

// Workspace memory for kernels, tracked under category "workspace" on the current tracker.
class TrackedWorkspace final : public WorkspaceAllocator {
   public:
    explicit TrackedWorkspace(Device d) : device_(d) {}
    void* alloc(size_t bytes) override {
        static const std::string label = "kernel workspace";
        uint64_t id = 0;
        void* p = current_memory_tracker().allocate(device_, bytes, MemCategory::WORKSPACE, label, &id);
        std::lock_guard<std::mutex> lk(mu_);
        ids_.push_back({p, id});
        return p;
    }
    void free(void* p, size_t bytes) override {
        static const std::string label = "kernel workspace";
        uint64_t id = 0;
        {
            std::lock_guard<std::mutex> lk(mu_);
            auto it = std::find_if(ids_.begin(), ids_.end(), [&](auto& e) { return e.first == p; });
            if (it != ids_.end()) {
                id = it->second;
                ids_.erase(it);
            }
        }
        current_memory_tracker().release(device_, p, bytes, MemCategory::WORKSPACE, label, id);
    }

   private:
    Device device_;
    std::mutex mu_;
    std::vector<std::pair<void*, uint64_t>> ids_;
};

std::string dname(DType t) {
    static const char* names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return size_t(t) < size_t(DType::COUNT) ? names[size_t(t)] : "?";
}

[[noreturn]] void require_fail(const char* op, const std::string& msg) { throw Error(str(op, ": ", msg)); }

// Checked on every op call; the message (string formatting, ~1 us each, several per op) is
// built only when the check fails.
#define KV_REQUIRE(ok, op, msg)             \
    do {                                    \
        if (!(ok)) require_fail((op), (msg)); \
    } while (0)

void require_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
    Device d{};
    bool first = true;
    for (const Tensor* t : ts) {
        if (!t->defined()) continue;
        if (first) {
            d = t->device();
            first = false;
        } else if (t->device() != d) {
            throw Error(str(op, ": operands live on different devices (", (*ts.begin())->describe(), " vs ", t->describe(), ")"));
        }
    }
}

void require_float(const char* op, const Tensor& t, const char* what) {
    KV_REQUIRE(dtype_is_float(t.dtype()), op, str(what, " must be a float tensor, got ", t.describe()));
}

// Can `src` broadcast to `dst` (same rank, each dim equal or 1)?
bool broadcastable(const Shape& src, const Shape& dst) {
    if (src.ndim != dst.ndim) return false;
    for (int i = 0; i < dst.ndim; ++i)
        if (src.d[i] != dst.d[i] && src.d[i] != 1) return false;
    return true;
}

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
    KV_REQUIRE(a.ndim == b.ndim, op, str("operands differ in rank: ", a.str(), " vs ", b.str()));
    Shape s = a;
    for (int i = 0; i < a.ndim; ++i) {
        if (a.d[i] == b.d[i] || b.d[i] == 1) s.d[i] = a.d[i];
        else if (a.d[i] == 1) s.d[i] = b.d[i];
        else throw Error(str(op, ": shapes ", a.str(), " and ", b.str(), " do not broadcast"));
    }
    return s;
}

TensorOptions like(const Tensor& t, MemCategory cat = MemCategory::ACTIVATIONS) {
    return TensorOptions{t.device(), cat, {}};
}

OpCall make_call(OpKind kind, Tensor& dst, std::initializer_list<const Tensor*> srcs) {
    OpCall c;
    c.op = kind;
    c.dst = dst.view();
    for (const Tensor* s : srcs) c.src[c.nsrc++] = s->view();
    return c;
}

}  // namespace

OpContext current_context() {
    OpContext ctx;
    ctx.threads = num_threads();
    return ctx;
}

void dispatch(OpCall& call) {
    KernelBackend& be = backend_for(call.dst.device);
    if (!be.supports_op(call)) {
        std::string srcs;
        for (int i = 0; i < call.nsrc; ++i) srcs += str(i ? ", " : "", dname(call.src[i].dtype));
        throw Error(str(op_kind_name(call.op), ": not supported by the ", be.name(), " backend for dst ", dname(call.dst.dtype),
                        " and sources (", srcs, ")"));
    }
    TrackedWorkspace ws(call.dst.device);
    OpContext ctx = current_context();
    ctx.workspace = &ws;
    be.compute(ctx, call);
}

// ---- [SECTION] linear algebra -------------------------------------------------------------------
void matmul_(Tensor& out, const Tensor& a, const Tensor& b, float alpha, float beta) {
    const char* op = "matmul";
    require_same_device(op, {&out, &a, &b});
    KV_REQUIRE(a.ndim() >= 2 && b.ndim() >= 2 && a.ndim() == b.ndim() && out.ndim() == a.ndim(), op,
            str("operands must have equal rank >= 2, got ", a.describe(), " @ ", b.describe(), " -> ", out.describe()));
    int n = a.ndim();
    KV_REQUIRE(a.size(n - 1) == b.size(n - 2), op,
            str("inner dimensions differ: ", a.shape().str(), " @ ", b.shape().str()));
    KV_REQUIRE(out.size(n - 2) == a.size(n - 2) && out.size(n - 1) == b.size(n - 1), op,
            str("output ", out.shape().str(), " does not match ", a.shape().str(), " @ ", b.shape().str()));
    for (int i = 0; i < n - 2; ++i) {
        int64_t bs = std::max(a.size(i), b.size(i));
        KV_REQUIRE((a.size(i) == bs || a.size(i) == 1) && (b.size(i) == bs || b.size(i) == 1) && out.size(i) == bs, op,
                str("batch dimensions do not broadcast: ", a.shape().str(), " @ ", b.shape().str(), " -> ", out.shape().str()));
    }
    KV_REQUIRE(a.dtype() == b.dtype(), op, str("input dtypes differ: ", a.describe(), " vs ", b.describe()));
    require_float(op, a, "input");
    require_float(op, out, "output");
    OpCall c = make_call(OpKind::MATMUL, out, {&a, &b});
    c.p.alpha = alpha;
    c.p.beta = beta;
    dispatch(c);
}

Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype) {
    KV_REQUIRE(a.ndim() >= 2 && a.ndim() == b.ndim(), "matmul",
            str("operands must have equal rank >= 2, got ", a.describe(), " and ", b.describe()));
    Shape s = a.shape();
    int n = a.ndim();
    for (int i = 0; i < n - 2; ++i) s.d[i] = std::max(a.size(i), b.size(i));
    s.d[n - 1] = b.size(n - 1);
    if (out_dtype == DType::F32 && a.dtype() == DType::F64) out_dtype = DType::F64;
    Tensor out = Tensor::empty(s, out_dtype, like(a));
    matmul_(out, a, b);
    return out;
}

Tensor linear(const Tensor& x, const Tensor& w, DType out_dtype) {
    KV_REQUIRE(w.ndim() == 2, "linear", str("weight must be 2-D [out, in], got ", w.describe()));
    KV_REQUIRE(x.size(-1) == w.size(1), "linear", str("input ", x.shape().str(), " does not match weight [out, in] = ", w.shape().str()));
    Tensor wt = w.transpose(0, 1);
    // x [..., K] -> [prod(...), K] viewed with a leading 1-batch so ranks match.
    Tensor x2 = x;
    if (x.ndim() != 2) {
        Tensor xc = x.is_contiguous() ? x : x.contiguous();
        x2 = xc.reshape({-1, x.size(-1)});
    }
    Tensor y = matmul(x2, wt, out_dtype);
    if (x.ndim() == 2) return y;
    Shape s = x.shape();
    s.d[s.ndim - 1] = w.size(0);
    return y.reshape(s);
}

// ---- [SECTION] elementwise ----------------------------------------------------------------------
namespace {
void binary_(OpKind kind, const char* op, Tensor& out, const Tensor& a, const Tensor& b) {
    require_same_device(op, {&out, &a, &b});
    require_float(op, a, "first operand");
    require_float(op, b, "second operand");
    require_float(op, out, "output");
    KV_REQUIRE(broadcastable(a.shape(), out.shape()) && broadcastable(b.shape(), out.shape()), op,
            str("operands ", a.shape().str(), " and ", b.shape().str(), " do not broadcast to ", out.shape().str()));
    OpCall c = make_call(kind, out, {&a, &b});
    dispatch(c);
}
}  // namespace

void add_(Tensor& out, const Tensor& a, const Tensor& b) { binary_(OpKind::ADD, "add", out, a, b); }
void mul_(Tensor& out, const Tensor& a, const Tensor& b) { binary_(OpKind::MUL, "mul", out, a, b); }

Tensor add(const Tensor& a, const Tensor& b) {
    Tensor out = Tensor::empty(broadcast_shape("add", a.shape(), b.shape()), a.dtype(), like(a));
    add_(out, a, b);
    return out;
}
Tensor mul(const Tensor& a, const Tensor& b) {
    Tensor out = Tensor::empty(broadcast_shape("mul", a.shape(), b.shape()), a.dtype(), like(a));
    mul_(out, a, b);
    return out;
}

void scale_(Tensor& out, const Tensor& a, float s) {
    require_same_device("scale", {&out, &a});
    require_float("scale", a, "input");
    require_float("scale", out, "output");
    KV_REQUIRE(a.shape() == out.shape(), "scale", str("input ", a.shape().str(), " vs output ", out.shape().str()));
    OpCall c = make_call(OpKind::SCALE, out, {&a});
    c.p.alpha = s;
    dispatch(c);
}
Tensor scale(const Tensor& a, float s) {
    Tensor out = Tensor::empty(a.shape(), a.dtype(), like(a));
    scale_(out, a, s);
    return out;
}

void silu_(Tensor& out, const Tensor& x) {
    require_same_device("silu", {&out, &x});
    require_float("silu", x, "input");
    KV_REQUIRE(x.shape() == out.shape(), "silu", str("input ", x.shape().str(), " vs output ", out.shape().str()));
    OpCall c = make_call(OpKind::SILU, out, {&x});
    dispatch(c);
}
Tensor silu(const Tensor& x) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), like(x));
    silu_(out, x);
    return out;
}

void gated_(Tensor& out, const Tensor& gate, const Tensor& up, GateAct act) {
    require_same_device("swiglu", {&out, &gate, &up});
    require_float("swiglu", gate, "gate");
    require_float("swiglu", up, "up");
    KV_REQUIRE(gate.shape() == up.shape() && gate.shape() == out.shape(), "swiglu",
            str("gate ", gate.shape().str(), ", up ", up.shape().str(), " and output ", out.shape().str(), " must match"));
    KV_REQUIRE(act < GateAct::COUNT, "swiglu", str("unknown gate activation ", int(act)));
    OpCall c = make_call(OpKind::SWIGLU, out, {&gate, &up});
    c.p.act = int(act);
    dispatch(c);
}
Tensor gated(const Tensor& gate, const Tensor& up, GateAct act) {
    Tensor out = Tensor::empty(gate.shape(), gate.dtype(), like(gate));
    gated_(out, gate, up, act);
    return out;
}
void swiglu_(Tensor& out, const Tensor& gate, const Tensor& up) { gated_(out, gate, up, GateAct::SILU); }
Tensor swiglu(const Tensor& gate, const Tensor& up) { return gated(gate, up, GateAct::SILU); }

// ---- [SECTION] normalisation and softmax --------------------------------------------------------
void rmsnorm_(Tensor& out, const Tensor& x, const Tensor& weight, float eps, float weight_offset) {
    const char* op = "rmsnorm";
    require_same_device(op, {&out, &x, &weight});
    require_float(op, x, "input");
    KV_REQUIRE(x.ndim() >= 1 && x.shape() == out.shape(), op, str("input ", x.shape().str(), " vs output ", out.shape().str()));
    KV_REQUIRE(eps >= 0, op, str("eps must be >= 0, got ", eps));
    OpCall c;
    if (weight.defined()) {
        KV_REQUIRE(weight.ndim() == 1 && weight.size(0) == x.size(-1), op,
                str("weight ", weight.shape().str(), " must be 1-D of the input's last size ", x.size(-1)));
        require_float(op, weight, "weight");
        c = make_call(OpKind::RMSNORM, out, {&x, &weight});
    } else {
        c = make_call(OpKind::RMSNORM, out, {&x});
    }
    c.p.eps = eps;
    c.p.weight_offset = weight_offset;
    dispatch(c);
}
Tensor rmsnorm(const Tensor& x, const Tensor& weight, float eps, float weight_offset) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), like(x));
    rmsnorm_(out, x, weight, eps, weight_offset);
    return out;
}

void softmax_(Tensor& out, const Tensor& x, float s) {
    require_same_device("softmax", {&out, &x});
    require_float("softmax", x, "input");
    KV_REQUIRE(x.ndim() >= 1 && x.shape() == out.shape(), "softmax", str("input ", x.shape().str(), " vs output ", out.shape().str()));
    OpCall c = make_call(OpKind::SOFTMAX, out, {&x});
    c.p.alpha = s;
    dispatch(c);
}
Tensor softmax(const Tensor& x, float s) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), like(x));
    softmax_(out, x, s);
    return out;
}

// ---- [SECTION] position encoding ----------------------------------------------------------------
namespace {
// Shared by rope_ and rope_backward_: x/out (B, NH, T, HS), positions inside the tables.
// Returns n_rot with 0 resolved to HS.
int check_rope(const char* op, const Tensor& out, const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot) {
    require_same_device(op, {&out, &x, &pos, &cos, &sin});
    KV_REQUIRE(x.ndim() == 4, op, str("x must be (B, NH, T, HS), got ", x.describe()));
    require_float(op, x, "input");
    require_float(op, out, "output");
    KV_REQUIRE(out.shape() == x.shape(), op, str("output ", out.shape().str(), " must match x ", x.shape().str()));
    int64_t hs = x.size(3);
    if (n_rot == 0) n_rot = int(hs);
    KV_REQUIRE(n_rot > 0 && n_rot <= hs && n_rot % 2 == 0, op, str("n_rot ", n_rot, " must be even and in (0, ", hs, "]"));
    KV_REQUIRE(pos.ndim() == 2 && pos.dtype() == DType::I32 && (pos.size(0) == x.size(0) || pos.size(0) == 1) && pos.size(1) == x.size(2),
            op, str("positions must be int32 (B|1, T) = (", x.size(0), "|1, ", x.size(2), "), got ", pos.describe()));
    // f64 tables serve an f64 forward on the CPU (the device kernels read f32)
    const bool table_dtype_ok = cos.dtype() == sin.dtype() && (cos.dtype() == DType::F32 || (cos.dtype() == DType::F64 && cos.device().is_cpu()));
    KV_REQUIRE(cos.ndim() == 2 && sin.shape() == cos.shape() && cos.size(1) == n_rot / 2 && table_dtype_ok, op,
               str("cos/sin tables must be f32 (P, ", n_rot / 2, ") (f64 on the CPU), got ", cos.describe(), " / ", sin.describe()));
    if (pos.device().is_cpu()) {
        int64_t max_p = cos.size(0);
        TensorView pv = pos.view();
        for (int64_t b = 0; b < pos.size(0); ++b)
            for (int64_t t = 0; t < pos.size(1); ++t) {
                int32_t p = *reinterpret_cast<const int32_t*>(pv.bytes() + b * pv.nb[0] + t * pv.nb[1]);
                if (p < 0 || p >= max_p)
                    throw Error(str(op, ": position ", p, " is outside the RoPE table of ", max_p, " positions"),
                                "the context width used to build the table must cover every position");
            }
    }
    return n_rot;
}
}  // namespace

void rope_(Tensor& out, const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot) {
    n_rot = check_rope("rope", out, x, pos, cos, sin, n_rot);
    OpCall c = make_call(OpKind::ROPE, out, {&x, &pos, &cos, &sin});
    c.p.n_rot = n_rot;
    dispatch(c);
}
Tensor rope(const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot) {
    Tensor out = Tensor::empty(x.shape(), x.dtype(), like(x));
    rope_(out, x, pos, cos, sin, n_rot);
    return out;
}

// ---- [SECTION] indexing -------------------------------------------------------------------------
namespace {
void check_index_range(const char* op, const Tensor& index, int64_t limit, const char* what) {
    if (!index.device().is_cpu()) return;  // device kernels clamp; host-side check is authoritative
    // An expanded index (gather's (B, 1, T, D) over one column of slots) repeats its values along
    // stride-0 dims: those values are checked once, and only a bad one is looked for again in
    // the whole index to name its element.
    bool repeats = false;
    Shape once = index.shape();
    std::vector<int64_t> strides((size_t)index.ndim());
    for (int d = 0; d < index.ndim(); ++d) {
        strides[size_t(d)] = index.stride(d);
        if (index.stride(d) == 0 && index.size(d) > 1) repeats = true, once[d] = 1;
    }
    if (repeats) {
        bool bad = false;
        for (int64_t v : index.as_strided(once, strides, index.offset()).to_i64_vector()) bad |= v < 0 || v >= limit;
        if (!bad) return;
    }
    std::vector<int64_t> ids = index.to_i64_vector();
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= limit)
            throw Error(str(op, ": ", what, " ", ids[i], " at element ", i, " is out of range [0, ", limit, ")"));
}
void require_index(const char* op, const Tensor& index) {
    KV_REQUIRE(index.dtype() == DType::I32 || index.dtype() == DType::I64, op,
            str("index must be int32 or int64, got ", index.describe()));
}
}  // namespace

void embedding_(Tensor& out, const Tensor& table, const Tensor& ids) {
    const char* op = "embedding";
    require_same_device(op, {&out, &table, &ids});
    require_index(op, ids);
    KV_REQUIRE(table.ndim() == 2, op, str("table must be (V, C), got ", table.describe()));
    KV_REQUIRE(out.ndim() == ids.ndim() + 1 && out.size(-1) == table.size(1), op,
            str("output ", out.shape().str(), " must be ids ", ids.shape().str(), " + (", table.size(1), ",)"));
    for (int i = 0; i < ids.ndim(); ++i)
        KV_REQUIRE(out.size(i) == ids.size(i), op, str("output ", out.shape().str(), " does not match ids ", ids.shape().str()));
    check_index_range(op, ids, table.size(0), "token id");
    OpCall c = make_call(OpKind::EMBEDDING, out, {&table, &ids});
    dispatch(c);
}
Tensor embedding(const Tensor& table, const Tensor& ids, DType out_dtype) {
    Shape s = ids.shape();
    KV_REQUIRE(s.ndim < KV_MAX_DIMS, "embedding", "ids rank too large");
    s.d[s.ndim++] = table.size(1);
    Tensor out = Tensor::empty(s, out_dtype, like(table));
    embedding_(out, table, ids);
    return out;
}

void gather_(Tensor& out, const Tensor& src, int axis, const Tensor& index) {
    const char* op = "gather";
    require_same_device(op, {&out, &src, &index});
    require_index(op, index);
    int n = src.ndim();
    int ax = axis < 0 ? axis + n : axis;
    KV_REQUIRE(ax >= 0 && ax < n, op, str("axis ", axis, " invalid for rank ", n));
    KV_REQUIRE(out.ndim() == n && index.ndim() == n, op, "src, index and output must have equal rank");
    KV_REQUIRE(broadcastable(index.shape(), out.shape()), op,
            str("index ", index.shape().str(), " must match (or broadcast to) output ", out.shape().str()));
    for (int i = 0; i < n; ++i)
        if (i != ax)
            KV_REQUIRE(out.size(i) == src.size(i), op,
                    str("output ", out.shape().str(), " and src ", src.shape().str(), " differ outside axis ", ax));
    KV_REQUIRE(dtype_is_float(src.dtype()) == dtype_is_float(out.dtype()), op, "src and output must both be float or both be int");
    check_index_range(op, index, src.size(ax), "index");
    OpCall c = make_call(OpKind::GATHER, out, {&src, &index});
    c.p.axis = ax;
    dispatch(c);
}
Tensor gather(const Tensor& src, int axis, const Tensor& index) {
    Shape s = index.shape();
    Tensor out = Tensor::empty(s, src.dtype(), like(src));
    gather_(out, src, axis, index);
    return out;
}

void scatter_(Tensor& dst, int axis, const Tensor& index, const Tensor& src) {
    const char* op = "scatter";
    require_same_device(op, {&dst, &src, &index});
    require_index(op, index);
    int n = dst.ndim();
    int ax = axis < 0 ? axis + n : axis;
    KV_REQUIRE(ax >= 0 && ax < n, op, str("axis ", axis, " invalid for rank ", n));
    KV_REQUIRE(src.ndim() == n && index.ndim() == n, op, "dst, index and src must have equal rank");
    KV_REQUIRE(broadcastable(index.shape(), src.shape()), op,
            str("index ", index.shape().str(), " must match (or broadcast to) src ", src.shape().str()));
    for (int i = 0; i < n; ++i)
        if (i != ax)
            KV_REQUIRE(dst.size(i) == src.size(i), op,
                    str("dst ", dst.shape().str(), " and src ", src.shape().str(), " differ outside axis ", ax));
    KV_REQUIRE(dtype_is_float(src.dtype()) == dtype_is_float(dst.dtype()), op, "src and dst must both be float or both be int");
    check_index_range(op, index, dst.size(ax), "index");
    OpCall c = make_call(OpKind::SCATTER, dst, {&src, &index});
    c.p.axis = ax;
    dispatch(c);
}

// ---- [SECTION] copies ---------------------------------------------------------------------------
void copy_(Tensor& dst, const Tensor& src) {
    require_same_device("copy", {&dst, &src});
    KV_REQUIRE(dst.shape() == src.shape(), "copy", str("shapes differ: ", src.shape().str(), " -> ", dst.shape().str()));
    if (dst.numel() == 0) return;
    OpCall c = make_call(OpKind::COPY, dst, {&src});
    dispatch(c);
}
Tensor cast(const Tensor& x, DType dtype) { return x.to(dtype); }

// ---- [SECTION] attention ------------------------------------------------------------------------
namespace {
// Shared by sdpa_ and sdpa_backward_: q (B, NH, n, HS), k/v (B, G, T, HS), positions, window.
void check_sdpa(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos, const Tensor& qpos, int window) {
    KV_REQUIRE(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, op,
            str("q, k, v must be 4-D (B, heads, tokens, head size), got ", q.describe(), ", ", k.describe(), ", ", v.describe()));
    const int64_t B = q.size(0), n = q.size(2), HS = q.size(3), NH = q.size(1), G = k.size(1), T = k.size(2);
    KV_REQUIRE(k.size(0) == B && v.shape() == k.shape() && k.size(3) == HS, op,
            str("k ", k.shape().str(), " and v ", v.shape().str(), " must be (", B, ", G, T, ", HS, ")"));
    KV_REQUIRE(G > 0 && NH % G == 0, op, str(NH, " query heads are not a multiple of ", G, " KV heads"));
    KV_REQUIRE(kpos.dtype() == DType::I32 && kpos.ndim() == 3 && (kpos.size(0) == B || kpos.size(0) == 1) &&
                (kpos.size(1) == G || kpos.size(1) == 1) && kpos.size(2) == T,
            op, str("slot positions must be int32 (B|1, G|1, T) = (", B, "|1, ", G, "|1, ", T, "), got ", kpos.describe()));
    KV_REQUIRE(qpos.dtype() == DType::I32 && qpos.ndim() == 2 && (qpos.size(0) == B || qpos.size(0) == 1) && qpos.size(1) == n, op,
            str("query positions must be int32 (B|1, n) = (", B, "|1, ", n, "), got ", qpos.describe()));
    require_float(op, q, "q");
    require_float(op, k, "k");
    require_float(op, v, "v");
    KV_REQUIRE(window >= 0, op, str("window must be >= 0, got ", window));
}
}  // namespace

namespace {
thread_local float t_softcap = 0.0f;
thread_local const Tensor* t_sinks = nullptr;
thread_local Tensor* t_dsinks = nullptr;

// The open AttentionSinks scope's logits checked against this call's q, or null.
const Tensor* sdpa_sinks(const char* op, const Tensor& q) {
    if (!t_sinks) return nullptr;
    KV_REQUIRE(q.device().type == DeviceType::CPU, op,
               str("attention sinks are computed by the CPU backend only, not on ", device_name(q.device())));
    KV_REQUIRE(t_sinks->ndim() == 1 && t_sinks->size(0) == q.size(1) && dtype_is_float(t_sinks->dtype()), op,
               str("attention sinks must be float (", q.size(1), ") (one logit per query head of q ", q.shape().str(), "), got ",
                   t_sinks->describe(), "; an attention path that splits the heads opens a nested AttentionSinks scope over its heads' slice"));
    KV_REQUIRE(t_sinks->device() == q.device(), op, "attention sinks live on another device");
    return t_sinks;
}

float sdpa_softcap(const char* op, const Tensor& y) {
    if (t_softcap > 0.0f)
        KV_REQUIRE(y.device().type == DeviceType::CPU, op,
                   str("attention logit soft-capping (", t_softcap, ") is computed by the CPU backend only, not on ", device_name(y.device())));
    return t_softcap;
}
}  // namespace

AttentionSoftcap::AttentionSoftcap(double cap) : prev_(t_softcap) { t_softcap = float(cap); }
AttentionSoftcap::~AttentionSoftcap() { t_softcap = prev_; }
float AttentionSoftcap::current() { return t_softcap; }

AttentionSinks::AttentionSinks(const Tensor* sinks, Tensor* dsinks) : prev_(t_sinks), prev_d_(t_dsinks) {
    t_sinks = sinks && sinks->defined() ? sinks : nullptr;
    t_dsinks = t_sinks && dsinks && dsinks->defined() ? dsinks : nullptr;
}
AttentionSinks::~AttentionSinks() { t_sinks = prev_, t_dsinks = prev_d_; }
const Tensor* AttentionSinks::current() { return t_sinks; }
Tensor* AttentionSinks::current_grad() { return t_dsinks; }

// The CUDA kernel has no lse output yet; with sinks the lse holds the sink's term (see ops.h).
bool sdpa_lse_supported(const Device& device) { return device.type == DeviceType::CPU && !t_sinks; }

void sdpa_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos, const Tensor& qpos, float scale,
           int window, Tensor* wsum, Tensor* lse) {
    const char* op = "sdpa";
    require_same_device(op, {&y, &q, &k, &v, &kpos, &qpos});
    check_sdpa(op, q, k, v, kpos, qpos, window);
    KV_REQUIRE(y.shape() == q.shape(), op, str("output ", y.shape().str(), " must match q ", q.shape().str()));
    const int64_t B = q.size(0), G = k.size(1), T = k.size(2);
    const Tensor* sinks = sdpa_sinks(op, q);
    OpCall c = sinks ? make_call(OpKind::SDPA, y, {&q, &k, &v, &kpos, &qpos, sinks}) : make_call(OpKind::SDPA, y, {&q, &k, &v, &kpos, &qpos});
    c.p.alpha = scale;
    c.p.window = window;
    c.p.softcap = sdpa_softcap(op, y);
    if (wsum) {
        KV_REQUIRE(wsum->ndim() == 3 && wsum->size(0) == B && wsum->size(1) == G && wsum->size(2) == T && dtype_is_float(wsum->dtype()),
                op, str("weight sums must be float (", B, ", ", G, ", ", T, "), got ", wsum->describe()));
        KV_REQUIRE(wsum->device() == y.device(), op, "weight sums live on another device");
        c.dst2 = wsum->view();
    }
    if (lse) {
        KV_REQUIRE(lse->ndim() == 3 && lse->size(0) == B && lse->size(1) == q.size(1) && lse->size(2) == q.size(2) &&
                       (lse->dtype() == DType::F32 || lse->dtype() == DType::F64),
                   op, str("log-sum-exp output must be f32 or f64 (", B, ", ", q.size(1), ", ", q.size(2), "), got ", lse->describe()));
        KV_REQUIRE(lse->device() == y.device(), op, "log-sum-exp output lives on another device");
        KV_REQUIRE(!sinks, op, "the log-sum-exp output is not available with attention sinks (the sink's term is in every row)");
        KV_REQUIRE(sdpa_lse_supported(y.device()), op,
                   str("the log-sum-exp output is computed by the CPU backend only, not on ", device_name(y.device())));
        c.dst3 = lse->view();
    }
    dispatch(c);
}

void sdpa_kivi_(Tensor& y, const Tensor& q, const KiviCacheViews& kv, const Tensor& kpos, const Tensor& qpos, float scale,
                int window, Tensor* wsum) {
    const char* op = "sdpa_kivi";
    require_same_device(op, {&y, &q, kv.kcodes, kv.kscales, kv.vcodes, kv.vscales, kv.residual, kv.map, &kpos, &qpos});
    KV_REQUIRE(y.shape() == q.shape(), op, str("output ", y.shape().str(), " must match q ", q.shape().str()));
    KV_REQUIRE(t_softcap == 0.0f, op, "attention logit soft-capping is not implemented for KIVI caches; use another buffer");
    const Tensor* sinks = sdpa_sinks(op, q);
    OpCall c = make_call(OpKind::SDPA_KIVI, y, {&q, kv.kcodes, kv.kscales, kv.vcodes, kv.vscales, kv.residual, kv.map, &kpos, &qpos});
    if (sinks) c.src[c.nsrc++] = sinks->view();  // source 9 (kernels/common/kivi_op.h)
    c.p.alpha = scale;
    c.p.window = window;
    c.p.kivi_bits = kv.bits;
    c.p.kivi_group = kv.group;
    if (wsum) {
        KV_REQUIRE(wsum->device() == y.device(), op, "weight sums live on another device");
        c.dst2 = wsum->view();
    }
    KV_REQUIRE(kivi_call_ok(c), op,
               str("inconsistent KIVI cache views for q ", q.shape().str(), " (bits ", kv.bits, ", group ", kv.group, "): codes ",
                   kv.kcodes->shape().str(), " / ", kv.vcodes->shape().str(), ", scales ", kv.kscales->shape().str(), " / ",
                   kv.vscales->shape().str(), ", residual ", kv.residual->shape().str(), ", map ", kv.map->shape().str(),
                   ", kpos ", kpos.shape().str(), "; expected the layout of kernels/common/kivi_math.h"));
    dispatch(c);
}

void sdpa_qrows_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, QuantFormat kf, QuantFormat vf, const QuantLevels& levels,
                 const Tensor& kpos, const Tensor& qpos, float scale, int window, Tensor* wsum) {
    const char* op = "sdpa_qrows";
    require_same_device(op, {&y, &q, &k, &v, &kpos, &qpos});
    KV_REQUIRE(t_softcap == 0.0f, op, "attention logit soft-capping is not implemented over quantized rows; use another buffer");
    KV_REQUIRE(!t_sinks, op, "attention sinks are not implemented over quantized rows; use another buffer");
    OpCall c = make_call(OpKind::SDPA_QROWS, y, {&q, &k, &v, &kpos, &qpos});
    c.p.alpha = scale;
    c.p.window = window;
    c.p.qformat = int(kf);
    c.p.qformat_v = int(vf);
    for (int i = 0; i < 16; ++i) c.p.qlevels[i] = levels.v[i];
    if (wsum) {
        KV_REQUIRE(wsum->device() == y.device(), op, "weight sums live on another device");
        c.dst2 = wsum->view();
    }
    KV_REQUIRE(qrows_call_ok(c), op,
               str("inconsistent quantized rows for q ", q.describe(), " and y ", y.describe(), ": keys ", k.describe(), " (",
                   quant_format_name(kf), "), values ", v.describe(), " (", quant_format_name(vf), "), kpos ", kpos.describe(),
                   ", qpos ", qpos.describe(), "; expected f32 q/y (B, NH, n, D), u8 rows (B, G, L, row bytes) of an fp8, fp4 or ",
                   "TurboQuant format, int32 positions and f32 weight sums (B, G, T)"));
    dispatch(c);
}

void sdpa_quest_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos, const Tensor& qpos,
                 const Tensor& kmin, const Tensor& kmax, float scale, int64_t page, int64_t pages, Tensor* wsum, Tensor* sel) {
    const char* op = "sdpa_quest";
    require_same_device(op, {&y, &q, &k, &v, &kpos, &qpos, &kmin, &kmax});
    check_sdpa(op, q, k, v, kpos, qpos, 0);
    KV_REQUIRE(y.shape() == q.shape(), op, str("output ", y.shape().str(), " must match q ", q.shape().str()));
    KV_REQUIRE(page > 0 && pages >= 0 && page < (int64_t(1) << 30) && pages < (int64_t(1) << 30), op,
               str("page size must be > 0 and pages >= 0, got ", page, " and ", pages));
    KV_REQUIRE(t_softcap == 0.0f, op, "attention logit soft-capping is not implemented for quest's page selection; use another policy");
    const Tensor* sinks = sdpa_sinks(op, q);
    OpCall c = sinks ? make_call(OpKind::SDPA_QUEST, y, {&q, &k, &v, &kpos, &qpos, &kmin, &kmax, sinks})
                     : make_call(OpKind::SDPA_QUEST, y, {&q, &k, &v, &kpos, &qpos, &kmin, &kmax});
    c.p.alpha = scale;
    c.p.quest_page = int(page);
    c.p.quest_pages = int(pages);
    if (wsum) {
        KV_REQUIRE(wsum->device() == y.device(), op, "weight sums live on another device");
        c.dst2 = wsum->view();
    }
    if (sel) {
        KV_REQUIRE(sel->device() == y.device(), op, "the selection output lives on another device");
        c.dst3 = sel->view();
    }
    KV_REQUIRE(quest_call_ok(c), op,
               str("inconsistent Quest views for q ", q.shape().str(), ", k ", k.shape().str(), " (page ", page, ", pages ", pages,
                   "): kmin ", kmin.describe(), ", kmax ", kmax.describe(), ", weight sums ", wsum ? wsum->describe() : "none",
                   ", selection ", sel ? sel->describe() : "none",
                   "; expected f32 (B, G, ceil(T / page), HS) page keys and int32 (B, NH, n, pages + 1) selections"));
    dispatch(c);
}

// ---- [SECTION] quantization ---------------------------------------------------------------------
const char* quant_format_name(QuantFormat f) {
    static const char* names[] = {"q8",   "q4",   "nf4",  "q8_0", "q4_0", "fp8_e4m3", "fp8_e5m2", "nvfp4",
                                  "mxfp4", "tqk2", "tqk3", "tqk4", "tqv2", "tqv3",     "tqv4",     "tqv8"};
    static_assert(sizeof(names) / sizeof(names[0]) == size_t(QuantFormat::COUNT), "format names out of date");
    return size_t(f) < size_t(QuantFormat::COUNT) ? names[size_t(f)] : "?";
}

QuantFormat quant_format_from_name(const std::string& name) {
    for (size_t i = 0; i < size_t(QuantFormat::COUNT); ++i)
        if (name == quant_format_name(QuantFormat(i))) return QuantFormat(i);
    std::string all;
    for (size_t i = 0; i < size_t(QuantFormat::COUNT); ++i) all += str(i ? ", " : "", quant_format_name(QuantFormat(i)));
    throw Error(str("unknown quantization format '", name, "'; expected one of ", all));
}

namespace {
void check_quant_row(const char* op, QuantFormat f, int64_t n) {
    if (quant_row_ok(f, n)) return;
    const int blk = quant_block_elems(f);
    throw Error(str(op, ": a row of ", n, " values cannot be stored as ", quant_format_name(f), "; expected ",
                    tq_bits(f) ? str("a power of two from 16 to ", kTqMaxRow, " (the Hadamard rotation)")
                    : blk      ? str("a multiple of ", blk)
                               : std::string("an even number of values")));
}

void set_levels(OpCall& c, QuantFormat f, int64_t n) {
    const QuantLevels lv = quant_levels(f, n);
    std::copy(std::begin(lv.v), std::end(lv.v), std::begin(c.p.qlevels));
}
}  // namespace

QuantLevels quant_levels(QuantFormat f, int64_t n) {
    QuantLevels out;
    if (!tq_codebook(f)) return out;
    check_quant_row("quant_levels", f, n);
    // Computed once per (row length, width): a few milliseconds of f64 Lloyd-Max iteration.
    static std::mutex mu;
    static std::map<std::pair<int64_t, int>, QuantLevels> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = cache.try_emplace({n, tq_bits(f)});
    if (fresh) {
        const std::vector<double> c = lloyd_max_sphere_levels(n, tq_bits(f));
        for (size_t k = 0; k < c.size(); ++k) it->second.v[k] = float(c[k]);
    }
    return it->second;
}

void quantize_(Tensor& dst, const Tensor& x, QuantFormat f) {
    const char* op = "quantize";
    require_same_device(op, {&dst, &x});
    require_float(op, x, "input");
    check_quant_row(op, f, x.size(-1));
    Shape s = x.shape();
    s.d[s.ndim - 1] = quant_row_bytes(f, x.size(-1));
    KV_REQUIRE(dst.dtype() == DType::U8 && dst.shape() == s && dst.stride(-1) == 1, op,
            str("destination must be u8 ", s.str(), " with unit last stride, got ", dst.describe()));
    OpCall c = make_call(OpKind::QUANTIZE, dst, {&x});
    c.p.qformat = int(f);
    set_levels(c, f, x.size(-1));
    dispatch(c);
}

Tensor quantize(const Tensor& x, QuantFormat f) {
    check_quant_row("quantize", f, x.size(-1));
    Shape s = x.shape();
    s.d[s.ndim - 1] = quant_row_bytes(f, x.size(-1));
    Tensor out = Tensor::empty(s, DType::U8, like(x));
    quantize_(out, x, f);
    return out;
}

void dequantize_(Tensor& out, const Tensor& q, QuantFormat f) {
    const char* op = "dequantize";
    require_same_device(op, {&out, &q});
    require_float(op, out, "output");
    check_quant_row(op, f, out.size(-1));
    Shape s = out.shape();
    s.d[s.ndim - 1] = quant_row_bytes(f, out.size(-1));
    KV_REQUIRE(q.dtype() == DType::U8 && q.shape() == s && q.stride(-1) == 1, op,
            str("input must be u8 ", s.str(), " with unit last stride, got ", q.describe()));
    OpCall c = make_call(OpKind::DEQUANTIZE, out, {&q});
    c.p.qformat = int(f);
    set_levels(c, f, out.size(-1));
    dispatch(c);
}

// ---- [SECTION] gradients ------------------------------------------------------------------------
namespace {
int acc_bits(bool a1, bool a2 = false, bool a3 = false) { return (a1 ? KV_ACC_DST : 0) | (a2 ? KV_ACC_DST2 : 0) | (a3 ? KV_ACC_DST3 : 0); }

void require_same_shape(const char* op, const Tensor& a, const char* an, const Tensor& b, const char* bn) {
    KV_REQUIRE(a.shape() == b.shape(), op, str(an, " ", a.shape().str(), " and ", bn, " ", b.shape().str(), " must have the same shape"));
}
}  // namespace

void rmsnorm_backward_(Tensor& dx, Tensor* dweight, const Tensor& x, const Tensor& weight, const Tensor& dy, float eps,
                       float weight_offset, bool accumulate_dx, bool accumulate_dweight) {
    const char* op = "rmsnorm_backward";
    require_same_device(op, {&dx, &x, &weight, &dy});
    require_float(op, x, "x");
    require_float(op, dy, "dy");
    require_float(op, dx, "dx");
    KV_REQUIRE(x.ndim() >= 1, op, "x must have at least one dimension");
    require_same_shape(op, x, "x", dy, "dy");
    require_same_shape(op, x, "x", dx, "dx");
    KV_REQUIRE(eps >= 0, op, str("eps must be >= 0, got ", eps));
    OpCall c;
    if (weight.defined()) {
        KV_REQUIRE(weight.ndim() == 1 && weight.size(0) == x.size(-1), op,
                str("weight ", weight.shape().str(), " must be 1-D of the input's last size ", x.size(-1)));
        require_float(op, weight, "weight");
        c = make_call(OpKind::RMSNORM_BACKWARD, dx, {&x, &dy, &weight});
    } else {
        c = make_call(OpKind::RMSNORM_BACKWARD, dx, {&x, &dy});
    }
    if (dweight) {
        KV_REQUIRE(weight.defined(), op, "dweight was requested for a norm without weight");
        KV_REQUIRE(dweight->ndim() == 1 && dweight->size(0) == x.size(-1) && dtype_is_float(dweight->dtype()), op,
                str("dweight must be float (", x.size(-1), "), got ", dweight->describe()));
        KV_REQUIRE(dweight->device() == dx.device(), op, "dweight lives on another device");
        c.dst2 = dweight->view();
    }
    c.p.eps = eps;
    c.p.weight_offset = weight_offset;
    c.p.accumulate = acc_bits(accumulate_dx, accumulate_dweight);
    dispatch(c);
}

void rope_backward_(Tensor& dx, const Tensor& dy, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot, bool accumulate) {
    n_rot = check_rope("rope_backward", dx, dy, pos, cos, sin, n_rot);
    OpCall c = make_call(OpKind::ROPE_BACKWARD, dx, {&dy, &pos, &cos, &sin});
    c.p.n_rot = n_rot;
    c.p.accumulate = acc_bits(accumulate);
    dispatch(c);
}

void silu_backward_(Tensor& dx, const Tensor& x, const Tensor& dy, bool accumulate) {
    const char* op = "silu_backward";
    require_same_device(op, {&dx, &x, &dy});
    require_float(op, x, "x");
    require_float(op, dy, "dy");
    require_float(op, dx, "dx");
    require_same_shape(op, x, "x", dy, "dy");
    require_same_shape(op, x, "x", dx, "dx");
    OpCall c = make_call(OpKind::SILU_BACKWARD, dx, {&x, &dy});
    c.p.accumulate = acc_bits(accumulate);
    dispatch(c);
}

void swiglu_backward_(Tensor& dgate, Tensor& dup, const Tensor& gate, const Tensor& up, const Tensor& dy, bool accumulate,
                      GateAct act) {
    const char* op = "swiglu_backward";
    require_same_device(op, {&dgate, &dup, &gate, &up, &dy});
    for (const Tensor* t : {&gate, &up, &dy, (const Tensor*)&dgate, (const Tensor*)&dup}) require_float(op, *t, "every operand");
    require_same_shape(op, gate, "gate", up, "up");
    require_same_shape(op, gate, "gate", dy, "dy");
    require_same_shape(op, gate, "gate", dgate, "dgate");
    require_same_shape(op, gate, "gate", dup, "dup");
    KV_REQUIRE(act < GateAct::COUNT, op, str("unknown gate activation ", int(act)));
    OpCall c = make_call(OpKind::SWIGLU_BACKWARD, dgate, {&gate, &up, &dy});
    c.p.act = int(act);
    c.dst2 = dup.view();
    c.p.accumulate = acc_bits(accumulate, accumulate);
    dispatch(c);
}

void embedding_backward_(Tensor& dtable, const Tensor& ids, const Tensor& dy, bool accumulate) {
    const char* op = "embedding_backward";
    require_same_device(op, {&dtable, &ids, &dy});
    require_index(op, ids);
    KV_REQUIRE(dtable.ndim() == 2, op, str("dtable must be (V, C), got ", dtable.describe()));
    require_float(op, dtable, "dtable");
    require_float(op, dy, "dy");
    KV_REQUIRE(dy.ndim() == ids.ndim() + 1 && dy.size(-1) == dtable.size(1), op,
            str("dy ", dy.shape().str(), " must be ids ", ids.shape().str(), " + (", dtable.size(1), ",)"));
    for (int i = 0; i < ids.ndim(); ++i)
        KV_REQUIRE(dy.size(i) == ids.size(i), op, str("dy ", dy.shape().str(), " does not match ids ", ids.shape().str()));
    check_index_range(op, ids, dtable.size(0), "token id");
    OpCall c = make_call(OpKind::EMBEDDING_BACKWARD, dtable, {&dy, &ids});
    c.p.accumulate = acc_bits(accumulate);
    dispatch(c);
}

void sdpa_backward_(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos,
                    const Tensor& qpos, const Tensor& dy, float scale, const SdpaBackwardOptions& opt) {
    const char* op = "sdpa_backward";
    require_same_device(op, {&dq, &dk, &dv, &q, &k, &v, &kpos, &qpos, &dy});
    check_sdpa(op, q, k, v, kpos, qpos, opt.window);
    require_float(op, dy, "dy");
    require_same_shape(op, q, "q", dy, "dy");
    require_same_shape(op, q, "q", dq, "dq");
    require_same_shape(op, k, "k", dk, "dk");
    require_same_shape(op, v, "v", dv, "dv");
    for (const Tensor* t : {&dq, &dk, &dv}) require_float(op, *t, "gradient outputs");
    KV_REQUIRE(opt.max_temp_bytes >= 0, op, str("max_temp_bytes must be >= 0, got ", opt.max_temp_bytes));
    const Tensor* sinks = sdpa_sinks(op, q);
    OpCall c = sinks ? make_call(OpKind::SDPA_BACKWARD, dq, {&q, &k, &v, &kpos, &qpos, &dy, sinks})
                     : make_call(OpKind::SDPA_BACKWARD, dq, {&q, &k, &v, &kpos, &qpos, &dy});
    c.dst2 = dk.view();
    c.dst3 = dv.view();
    c.p.alpha = scale;
    c.p.window = opt.window;
    c.p.softcap = opt.softcap > 0 ? opt.softcap : sdpa_softcap(op, dq);
    c.p.max_temp_bytes = opt.max_temp_bytes;
    c.p.accumulate = acc_bits(opt.accumulate_dq, opt.accumulate_dk, opt.accumulate_dv);
    if (sinks && t_dsinks) {  // the scope's sink gradient accumulates over every call
        KV_REQUIRE(t_dsinks->shape() == sinks->shape() && dtype_is_float(t_dsinks->dtype()) && t_dsinks->device() == q.device(), op,
                   str("sink gradient must be float ", sinks->shape().str(), " on the attention's device, got ", t_dsinks->describe()));
        c.dst4 = t_dsinks->view();
        c.p.accumulate |= KV_ACC_DST4;
    }
    dispatch(c);
}

void axpy_(Tensor& y, const Tensor& x, float alpha) {
    const char* op = "axpy";
    require_same_device(op, {&y, &x});
    require_float(op, x, "x");
    require_float(op, y, "y");
    KV_REQUIRE(broadcastable(x.shape(), y.shape()), op, str("x ", x.shape().str(), " does not broadcast to y ", y.shape().str()));
    OpCall c = make_call(OpKind::AXPY, y, {&x});
    c.p.alpha = alpha;
    dispatch(c);
}

// ---- [SECTION] losses ---------------------------------------------------------------------------
namespace {
// logits (..., V), targets (...) int, class subset (K) int with ids < V; returns K.
int64_t check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, const Tensor& subset, int ignore_index) {
    require_float(op, logits, "logits");
    require_index(op, targets);
    KV_REQUIRE(logits.ndim() >= 1 && targets.ndim() == logits.ndim() - 1, op,
            str("targets ", targets.shape().str(), " must be logits ", logits.shape().str(), " without the last dimension"));
    for (int i = 0; i < targets.ndim(); ++i)
        KV_REQUIRE(targets.size(i) == logits.size(i), op,
                str("targets ", targets.shape().str(), " do not match logits ", logits.shape().str()));
    int64_t K = logits.size(-1);
    if (subset.defined()) {
        require_index(op, subset);
        KV_REQUIRE(subset.ndim() == 1 && subset.size(0) >= 1, op, str("class subset must be 1-D and non-empty, got ", subset.describe()));
        check_index_range(op, subset, logits.size(-1), "class id");
        K = subset.size(0);
    }
    KV_REQUIRE(K >= 1, op, "logits have no classes");
    if (targets.device().is_cpu()) {
        std::vector<int64_t> t = targets.to_i64_vector();
        for (size_t i = 0; i < t.size(); ++i)
            if (t[i] != ignore_index && (t[i] < 0 || t[i] >= K))
                throw Error(str(op, ": target ", t[i], " at element ", i, " is out of range [0, ", K, ") and is not the ignore index ",
                                ignore_index));
    }
    return K;
}
}  // namespace

void cross_entropy_(Tensor& loss, const Tensor& logits, const Tensor& targets, const Tensor& class_subset, int ignore_index) {
    const char* op = "cross_entropy";
    require_same_device(op, {&loss, &logits, &targets, &class_subset});
    check_cross_entropy(op, logits, targets, class_subset, ignore_index);
    require_float(op, loss, "loss");
    require_same_shape(op, loss, "loss", targets, "targets");
    OpCall c = class_subset.defined() ? make_call(OpKind::CROSS_ENTROPY, loss, {&logits, &targets, &class_subset})
                                      : make_call(OpKind::CROSS_ENTROPY, loss, {&logits, &targets});
    c.p.ignore_index = ignore_index;
    dispatch(c);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& class_subset, int ignore_index) {
    Tensor loss = Tensor::empty(targets.shape(), logits.dtype() == DType::F64 ? DType::F64 : DType::F32, like(logits));
    cross_entropy_(loss, logits, targets, class_subset, ignore_index);
    return loss;
}

void cross_entropy_backward_(Tensor& dlogits, const Tensor& logits, const Tensor& targets, float scale, const Tensor& dloss,
                             const Tensor& class_subset, int ignore_index, bool accumulate) {
    const char* op = "cross_entropy_backward";
    require_same_device(op, {&dlogits, &logits, &targets, &dloss, &class_subset});
    check_cross_entropy(op, logits, targets, class_subset, ignore_index);
    require_float(op, dlogits, "dlogits");
    require_same_shape(op, dlogits, "dlogits", logits, "logits");
    OpCall c = make_call(OpKind::CROSS_ENTROPY_BACKWARD, dlogits, {&logits, &targets});
    c.src[c.nsrc++] = class_subset.defined() ? class_subset.view() : TensorView{};
    if (dloss.defined()) {
        require_float(op, dloss, "dloss");
        require_same_shape(op, dloss, "dloss", targets, "targets");
        c.src[c.nsrc++] = dloss.view();
    }
    c.p.alpha = scale;
    c.p.ignore_index = ignore_index;
    c.p.accumulate = acc_bits(accumulate);
    dispatch(c);
}

// ---- [SECTION] optimizer ------------------------------------------------------------------------
const char* optim_name(OptimKind k) { return optim_kind_name(k); }

OptimKind optim_kind_from_name(const std::string& name) {
    for (size_t i = 0; i < size_t(OptimKind::COUNT); ++i)
        if (name == optim_kind_name(OptimKind(i))) return OptimKind(i);
    throw Error(str("unknown optimizer '", name, "'; expected adamw, adam, adamax, sgd, rmsprop or adadelta"));
}

void optimizer_step_(Tensor& param, const Tensor& grad, Tensor* state1, Tensor* state2, const OptimParams& opt) {
    const char* op = "optimizer_step";
    KV_REQUIRE(opt.kind >= 0 && opt.kind < int(OptimKind::COUNT), op, str("unknown optimizer kind ", opt.kind));
    const char* name = optim_kind_name(OptimKind(opt.kind));
    require_float(op, param, "param");
    require_float(op, grad, "grad");
    require_same_shape(op, param, "param", grad, "grad");
    KV_REQUIRE(param.device() == grad.device(), op, "param and grad live on different devices");
    KV_REQUIRE(opt.step >= 1, op, str("step must be >= 1 (the step being taken), got ", opt.step));
    KV_REQUIRE(opt.lr >= 0 && opt.eps >= 0 && opt.weight_decay >= 0 && opt.momentum >= 0, op,
            str(name, ": lr, eps, weight_decay and momentum must be >= 0"));
    const OptimKind kind = OptimKind(opt.kind);
    if (kind == OptimKind::ADAMW || kind == OptimKind::ADAM || kind == OptimKind::ADAMAX)
        KV_REQUIRE(opt.beta1 >= 0 && opt.beta1 < 1 && opt.beta2 >= 0 && opt.beta2 < 1, op,
                str(name, ": betas must be in [0, 1), got (", opt.beta1, ", ", opt.beta2, ")"));
    if (kind == OptimKind::SGD && opt.nesterov)
        KV_REQUIRE(opt.momentum > 0 && opt.dampening == 0, op, "sgd: nesterov momentum needs momentum > 0 and dampening 0");
    const int slots = optimizer_state_slots(opt);
    Tensor* st[2] = {state1, state2};
    OpCall c = make_call(OpKind::OPTIMIZER_STEP, param, {&grad});
    for (int i = 0; i < 2; ++i) {
        Tensor* s = st[i];
        if (i >= slots) continue;  // unused state slots are ignored
        KV_REQUIRE(s && s->defined(), op, str(name, " needs ", slots, " state tensor(s); state", i + 1, " is missing"));
        KV_REQUIRE(s->shape() == param.shape() && s->device() == param.device(), op,
                str(name, ": state", i + 1, " ", s->describe(), " must match param ", param.describe()));
        const DType want = param.dtype() == DType::F64 ? DType::F64 : DType::F32;
        KV_REQUIRE(s->dtype() == want, op, str(name, ": state", i + 1, " must be ", dname(want), ", got ", s->describe()));
        (i == 0 ? c.dst2 : c.dst3) = s->view();
    }
    c.p.opt = opt;
    dispatch(c);
}

void grad_norm_sq_(Tensor& out, const Tensor& g, bool accumulate) {
    const char* op = "grad_norm_sq";
    require_same_device(op, {&out, &g});
    require_float(op, g, "gradient");
    KV_REQUIRE(out.numel() == 1 && dtype_is_float(out.dtype()), op, str("output must be one float element, got ", out.describe()));
    OpCall c = make_call(OpKind::GRAD_NORM_SQ, out, {&g});
    c.p.accumulate = acc_bits(accumulate);
    dispatch(c);
}

// ---- [SECTION] reductions -----------------------------------------------------------------------
namespace {
Tensor reduce_last(OpKind kind, const char* op, const Tensor& x) {
    require_float(op, x, "input");
    KV_REQUIRE(x.ndim() >= 1, op, "input must have at least one dimension");
    Shape s = x.shape();
    s.ndim--;
    Tensor out = Tensor::empty(s, x.dtype() == DType::F64 ? DType::F64 : DType::F32, like(x));
    OpCall c = make_call(kind, out, {&x});
    dispatch(c);
    return out;
}
}  // namespace

Tensor sum_last(const Tensor& x) { return reduce_last(OpKind::SUM, "sum", x); }
Tensor max_last(const Tensor& x) { return reduce_last(OpKind::MAX, "max", x); }
Tensor norm_last(const Tensor& x) { return reduce_last(OpKind::NORM, "norm", x); }

}  // namespace kv::ops
