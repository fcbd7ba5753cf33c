// Full-precision buffers: K and V as (B, G, L, D) tensors in f32, bf16 or f16; plans become
// one gather/scatter for grace-ring moves and one scatter for the new tokens.
#include <algorithm>

#include "engine/kv/buffers/buffer_common.h"

namespace kv {

Tensor slot_index(const std::vector<int32_t>& slots, int64_t rows, int64_t B, int64_t G, int64_t m, Device device) {
    Tensor idx = Tensor::from_i32({rows == 1 ? 1 : B, rows == 1 ? 1 : G, m, 1}, slots, {device, MemCategory::WORKSPACE, "slot index"});
    return idx;
}

void apply_plan_to(Tensor& K, Tensor& V, const SlotPlan& plan, const Tensor& k, const Tensor& v) {
    // Keys and values may differ in width (think stores fewer key channels).
    const int64_t B = K.size(0), G = K.size(1), Dk = K.size(3), Dv = V.size(3);
    if (plan.moves > 0) {
        Tensor from = slot_index(plan.move_from, plan.rows, B, G, plan.moves, K.device());
        Tensor to = slot_index(plan.move_to, plan.rows, B, G, plan.moves, K.device());
        Tensor kk = ops::gather(K, 2, from.expand({B, G, plan.moves, Dk})), vv = ops::gather(V, 2, from.expand({B, G, plan.moves, Dv}));
        ops::scatter_(K, 2, to.expand({B, G, plan.moves, Dk}), kk);
        ops::scatter_(V, 2, to.expand({B, G, plan.moves, Dv}), vv);
    }
    Tensor idx = slot_index(plan.targets, plan.rows, B, G, plan.n, K.device());
    ops::scatter_(K, 2, idx.expand({B, G, plan.n, Dk}), k);
    ops::scatter_(V, 2, idx.expand({B, G, plan.n, Dv}), v);
}

void apply_plan_to_keys(Tensor& K, const SlotPlan& plan, const Tensor& k) {
    const int64_t B = K.size(0), G = K.size(1), D = K.size(3);
    if (plan.moves > 0) {
        Tensor from = slot_index(plan.move_from, plan.rows, B, G, plan.moves, K.device()).expand({B, G, plan.moves, D});
        Tensor to = slot_index(plan.move_to, plan.rows, B, G, plan.moves, K.device()).expand({B, G, plan.moves, D});
        Tensor kk = ops::gather(K, 2, from);
        ops::scatter_(K, 2, to, kk);
    }
    Tensor idx = slot_index(plan.targets, plan.rows, B, G, plan.n, K.device()).expand({B, G, plan.n, D});
    ops::scatter_(K, 2, idx, k);
}

namespace {

// Bounds of one merge (a damaged or foreign plan must not index outside the tensor).
void check_merge(const SlotPlan& plan, size_t i, int64_t rows, int64_t L) {
    const int64_t r = plan.merge_row[i], to = plan.merge_to[i], from = plan.merge_from[i];
    if (r < 0 || r >= rows || to < 0 || to >= L || from < 0 || from >= L || to == from)
        throw Error(str("value merge ", i, " (row ", r, ", slot ", from, " into ", to, ") does not fit a cache of ", rows, " rows x ", L,
                        " slots"));
}

// h[to] <- keep h[to] + take h[from] for each merge in order. Cloned per ISA level: the same
// bits at every width (two products and a sum, no contraction), four or eight doubles a step.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define KV_BLEND_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define KV_BLEND_CLONES
#endif
KV_BLEND_CLONES void blend_rows(double* h, int64_t D, const int64_t* to_row,
                                                                                           const int64_t* from_row, const float* keep,
                                                                                           const float* take, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        double* to = h + to_row[i] * D;
        const double* from = h + from_row[i] * D;
        const double a = keep[i], b = take[i];
        for (int64_t d = 0; d < D; ++d) to[d] = a * to[d] + b * from[d];
    }
}

}  // namespace

// The merges touch few slots of a large buffer: only those rows go through the host, in f64 and
// in plan order, each rounded to the buffer's dtype once at the end.
void merge_values_in(Tensor& V, const SlotPlan& plan, MergedValues* saved) {
    if (plan.merges() == 0) return;
    const int64_t rows = V.size(0) * V.size(1), L = V.size(2), D = V.size(3);
    for (size_t i = 0; i < plan.merges(); ++i) check_merge(plan, i, rows, L);
    // Each touched slot (flat row * L + slot) once, in first-touch order, and its row in h.
    std::vector<int32_t> local(size_t(rows * L), -1);
    std::vector<int64_t> flat;
    auto row_of = [&](int64_t f) {
        int32_t& at = local[size_t(f)];
        if (at < 0) at = int32_t(flat.size()), flat.push_back(f);
        return int64_t(at);
    };
    std::vector<int64_t> to_row(plan.merges()), from_row(plan.merges());
    for (size_t i = 0; i < plan.merges(); ++i) {
        to_row[i] = row_of(plan.merge_row[i] * L + plan.merge_to[i]);
        from_row[i] = row_of(plan.merge_row[i] * L + plan.merge_from[i]);
    }
    const int64_t S = int64_t(flat.size());
    // An f32 buffer in host memory is read and written in place; any other through gather/scatter.
    const bool host_f32 = V.device().type == DeviceType::CPU && V.dtype() == DType::F32 && V.is_contiguous();
    Tensor flat_V, idx;
    std::vector<double> h;
    if (host_f32) {
        const float* base = V.data<float>();
        h.resize(size_t(S * D));
        for (int64_t r = 0; r < S; ++r)
            for (int64_t d = 0; d < D; ++d) h[size_t(r * D + d)] = double(base[flat[size_t(r)] * D + d]);
    } else {
        flat_V = V.contiguous().reshape({rows * L, D});
        idx = Tensor::from_i64({S, 1}, flat, {V.device(), MemCategory::WORKSPACE, "merged slots"}).expand({S, D});
        h = ops::gather(flat_V, 0, idx).contiguous().to_f64_vector();
    }
    if (saved) {
        saved->rows.clear(), saved->values.clear();
        std::vector<uint8_t> seen(size_t(S), 0);
        for (size_t i = 0; i < plan.merges(); ++i) {
            const int64_t r = to_row[i];
            if (seen[size_t(r)]) continue;
            seen[size_t(r)] = 1;
            saved->rows.push_back(flat[size_t(r)]);
            saved->values.insert(saved->values.end(), h.begin() + r * D, h.begin() + (r + 1) * D);
        }
    }
    blend_rows(h.data(), D, to_row.data(), from_row.data(), plan.merge_keep.data(), plan.merge_take.data(), int64_t(plan.merges()));
    if (host_f32) {
        float* base = V.data<float>();
        for (int64_t r = 0; r < S; ++r)
            for (int64_t d = 0; d < D; ++d) base[flat[size_t(r)] * D + d] = float(h[size_t(r * D + d)]);
        return;
    }
    ops::scatter_(flat_V, 0, idx, Tensor::from_f64({S, D}, h, V.dtype(), {V.device(), MemCategory::WORKSPACE, "merged values"}));
    if (flat_V.storage() != V.storage()) V.copy_from(flat_V.reshape(V.shape()));
}

void restore_merged_values(Tensor& V, const MergedValues& saved) {
    if (saved.rows.empty()) return;
    const int64_t D = V.size(3);
    std::vector<double> h = V.contiguous().to_f64_vector();
    for (size_t i = 0; i < saved.rows.size(); ++i)
        std::copy_n(saved.values.begin() + int64_t(i) * D, D, h.begin() + saved.rows[i] * D);
    V.copy_from(Tensor::from_f64(V.shape(), h, DType::F64, {V.device(), MemCategory::WORKSPACE, "merged values"}));
}

void merge_values_backward(Tensor& dV, const SlotPlan& plan) {
    if (plan.merges() == 0) return;
    const int64_t rows = dV.size(0) * dV.size(1), L = dV.size(2), D = dV.size(3);
    std::vector<double> h = dV.contiguous().to_f64_vector();
    for (size_t k = plan.merges(); k-- > 0;) {
        check_merge(plan, k, rows, L);
        double* to = h.data() + (plan.merge_row[k] * L + plan.merge_to[k]) * D;
        double* from = h.data() + (plan.merge_row[k] * L + plan.merge_from[k]) * D;
        const double a = plan.merge_keep[k], b = plan.merge_take[k];
        for (int64_t d = 0; d < D; ++d) {
            from[d] += b * to[d];
            to[d] *= a;
        }
    }
    dV.copy_from(Tensor::from_f64(dV.shape(), h, DType::F64, {dV.device(), MemCategory::WORKSPACE, "merged value gradient"}));
}

namespace {

class DefaultBuffer final : public KVBuffer {
   public:
    DefaultBuffer(const BufferParams& p, DType dtype) : p_(p), dtype_(dtype) {}
    std::string name() const override { return std::string(dtype_ == DType::F32 ? "f32" : dtype_ == DType::BF16 ? "bf16" : dtype_ == DType::F16 ? "f16" : "f64"); }
    void allocate(int64_t B) override {
        if (K_.defined() && K_.size(0) >= B) return;
        const std::string l = str("layer ", p_.layer, " ");
        K_ = Tensor::zeros({B, p_.G, p_.L, p_.D}, dtype_, {p_.device, MemCategory::KV_CACHE, l + (p_.values_are_keys ? "latents" : "keys")});
        if (!p_.values_are_keys) V_ = Tensor::zeros({B, p_.G, p_.L, p_.D}, dtype_, {p_.device, MemCategory::KV_CACHE, l + "values"});
    }
    bool values_are_keys() const override { return p_.values_are_keys; }
    bool allocated() const override { return K_.defined(); }
    void release() override {
        K_ = Tensor();
        V_ = Tensor();
    }
    void prefill(const Tensor& k, const Tensor& v) override {
        const int64_t B = k.size(0), n = k.size(2);
        allocate(B);
        Tensor kd = K_.slice(0, 0, B).slice(2, 0, n);
        kd.copy_from(k);
        if (!p_.values_are_keys) {
            Tensor vd = V_.slice(0, 0, B).slice(2, 0, n);
            vd.copy_from(v);
        }
        B_ = B;
    }
    void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) override {
        Tensor K = K_.slice(0, 0, B_);
        if (p_.values_are_keys) {
            apply_plan_to_keys(K, plan, k);
            return;
        }
        Tensor V = V_.slice(0, 0, B_);
        apply_plan_to(K, V, plan, k, v);
    }
    void merge_values(const SlotPlan& plan) override {
        Tensor V = V_.slice(0, 0, B_);
        merge_values_in(V, plan);
    }
    std::pair<Tensor, Tensor> read(int64_t T) override {
        Tensor K = K_.slice(0, 0, B_).slice(2, 0, T);
        return {K, p_.values_are_keys ? K : V_.slice(0, 0, B_).slice(2, 0, T)};
    }
    size_t bytes() const override { return (K_.defined() ? K_.nbytes() : 0) + (V_.defined() ? V_.nbytes() : 0); }
    double bits_per_element() const override { return 8.0 * dtype_size(dtype_); }
    std::vector<Tensor*> storage_tensors() override {
        if (p_.values_are_keys) return {&K_};
        return {&K_, &V_};
    }
    int64_t slots() const override { return p_.L; }
    void resize_slots(int64_t L) override {
        // New storage of exactly L slots (memory = the slots kept), the kept slots copied over.
        const int64_t keep = std::min(L, p_.L);
        p_.L = L;
        if (!K_.defined()) return;
        Tensor K = std::move(K_), V = std::move(V_);
        allocate(K.size(0));
        Tensor kd = K_.slice(2, 0, keep);
        kd.copy_from(K.slice(2, 0, keep));
        if (p_.values_are_keys) return;
        Tensor vd = V_.slice(2, 0, keep);
        vd.copy_from(V.slice(2, 0, keep));
    }
    void reorder_batch(const std::vector<int32_t>& src) override {
        const int64_t B = int64_t(src.size());
        Tensor idx = Tensor::from_i32({B, 1, 1, 1}, src, {p_.device, MemCategory::WORKSPACE, "beam index"})
                         .expand({B, p_.G, p_.L, p_.D});
        Tensor k = ops::gather(K_.slice(0, 0, B), 0, idx);
        Tensor kd = K_.slice(0, 0, B);
        kd.copy_from(k);
        if (p_.values_are_keys) return;
        Tensor v = ops::gather(V_.slice(0, 0, B), 0, idx);
        Tensor vd = V_.slice(0, 0, B);
        vd.copy_from(v);
    }

   private:
    BufferParams p_;
    DType dtype_;
    Tensor K_, V_;
    int64_t B_ = 0;
};

}  // namespace

std::unique_ptr<KVBuffer> make_default_buffer(const BufferParams& p, DType dtype) { return std::make_unique<DefaultBuffer>(p, dtype); }

}  // namespace kv
