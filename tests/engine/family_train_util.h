// The set-up the families' training tests share (tiny-lfm2, tiny-mla, tiny-gpt-oss,
// tiny-gemma3n): one passkey example of 256 tokens trained on at every step, through an h2o
// cache of 64 slots in chunks of 16 (the full-attention layers evict), LoRA on q, k, v and the
// output projection; kernels on one thread so the steps are reproducible.
#pragma once

#include <string>

#include "engine/backend/backend_registry.h"
#include "engine/core/tensor.h"
#include "engine/run/run_config.h"

namespace kv::test {

struct SingleThread {
    int saved = num_threads();
    SingleThread() { set_num_threads(1); }
    ~SingleThread() { set_num_threads(saved); }
};

inline RunConfig family_train_run(const std::string& mode, const std::string& model, uint64_t data_seed) {
    RunConfig c;
    c.mode = mode;
    c.model = model;
    c.data.name = "passkey";
    c.data.seq_length = 256;
    c.data.num_samples = 1;  // every step trains on the same example
    c.data.val_split_fraction = 0.0;
    c.data.seed = data_seed;
    c.kv_cache.name = "h2o-default";
    c.kv_cache.cache_length = 64;  // 256 tokens in chunks of 16: the full-attention layers evict
    c.driver.chunk_size = 16;
    c.train.micro_batch_size = 1;
    c.train.global_batch_size = 1;
    c.train.lr_warmup_steps = 0;
    c.train.save_interval = 0;
    c.train.lora_targets = "q,k,v,proj";
    return c;
}

inline bool any_nonzero(const Tensor& t) {
    for (double v : t.contiguous().to_f64_vector())
        if (v != 0.0) return true;
    return false;
}

}  // namespace kv::test
