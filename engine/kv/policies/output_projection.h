// The layer's attention output projection W_o, for policies that weigh a slot by what its value
// adds to the layer's output (critical: ||W_o,h v||_1). The transformer hands each layer's W_o to
// the cache before every attend (LayerAttention::set_output_projection, beside the RoPE
// frequencies); KVCache passes it on to a layer's policy that implements this interface. A
// policy driven without a model (unit harnesses, benchmarks of one layer) never receives it.
#pragma once

namespace kv {

class Tensor;

class OutputProjectionUser {
   public:
    virtual ~OutputProjectionUser() = default;
    // wo: [E, NH * D] (nn.Linear's [out, in]), float of any dtype or packed, on any device.
    // Called before every attend of the layer: keep a converted copy keyed by the tensor.
    virtual void set_output_projection(const Tensor& wo) = 0;
    // Whether its scores read W_o (a wrapper passes it on to a policy that may not).
    virtual bool reads_output_projection() const { return true; }
};

}  // namespace kv
