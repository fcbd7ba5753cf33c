// Trainable additions to the model's linear layers (LoRA and friends). The transformer calls
// add() after each of its linear maps; a gradient pass calls backward() with the same input and
// positions. The model never knows what the adapter is; engine/grad implements LoRA behind this.
#pragma once

#include "engine/core/tensor.h"

namespace kv {

// The linear maps of a block (and the head) an adapter can attach to. QKV covers the stacked
// q/k/v projection (latent attention: the query projection W_q); GATE_UP the stacked gate/up
// projection (adapters slice their columns); KV_A and KV_B latent attention's W_kv_a (latent and
// k_pe) and W_kv_b (per-head k_nope and v from the latent).
enum class LinearSite : uint8_t { QKV, O, GATE_UP, DOWN, HEAD, KV_A, KV_B };

class LinearAdapters {
   public:
    virtual ~LinearAdapters() = default;
    // y (B, n, out) += adapter(x (B, n, in)) for layer `layer` (-1 for the head). The n tokens
    // sit at positions input_pos .. input_pos + n - 1 of the sequence: per-token randomness
    // (LoRA dropout) is keyed on them, so every recompute of a token draws the same.
    virtual void add(int layer, LinearSite site, const Tensor& x, int64_t input_pos, Tensor& y) const = 0;
    // Backward of add() for the same x and positions: accumulates the adapter's parameter
    // gradients from dy (B, n, out) and adds its contribution to dx (B, n, in).
    virtual void backward(int layer, LinearSite site, const Tensor& x, int64_t input_pos, const Tensor& dy, Tensor& dx) const = 0;
};

}  // namespace kv
