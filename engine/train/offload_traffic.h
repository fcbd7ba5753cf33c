// What the offload modes (finetune_offload_lora / _full, reference §10.1) move between host
// and device in one gradient computation. The weights, their gradients and the optimizer state
// live in host memory; phase 1 clones every shard to the device, phase 2 clones shards again in
// its order — lm_head + final norm, each row of layers top-down, then the embedding when it is
// trained — and copies the trained parameters' gradients of each shard back. Shards are the
// gradient pipeline's rows (grad.layers_per_cell layers each). On a CPU-only build host and
// device are the same memory: these are the bytes a device build would copy, counted from the
// tensors' sizes, not measured transfers. The optimizer steps on the host (no copies).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/grad/lora.h"
#include "engine/model/transformer.h"

namespace kv {

struct OffloadShard {
    std::string name;            // "embedding", "layers 0-1", "head (norm + lm_head)"
    size_t weight_bytes = 0;     // base weights plus adapters of the shard
    size_t trainable_bytes = 0;  // what gets a gradient (copied back after phase 2)
};

struct OffloadTraffic {
    std::vector<OffloadShard> shards;
    size_t h2d_bytes = 0;  // per gradient computation (one micro-batch)
    size_t d2h_bytes = 0;
    size_t largest_shard_bytes = 0;  // the device needs room for one shard at a time in phase 2
};

// lora: the adapters when training LoRA (nullptr: full fine-tuning, every weight trained).
OffloadTraffic offload_traffic(const Transformer& model, const Lora* lora, int64_t layers_per_cell);

}  // namespace kv
