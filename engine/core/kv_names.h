// The names of KV cache buffers ("{policy}-{buffer}", keys_values' naming), in one place for
// every layer that reads or validates them: engine/kv validates and builds caches, storage
// splits recorded names into labels, the run form and compare dialog list them. Policy names
// come from the policy registry (engine/kv/policy_registry.h: kv_policy_names()).
#pragma once

#include <string>
#include <vector>

namespace kv {

// Buffer names never contain '-', so a cache name splits at its last dash.
inline const std::vector<std::string>& kv_buffer_names() {
    static const std::vector<std::string> v = {"default", "f32", "bf16", "f16", "q8", "q4", "nf4", "q8_0", "q4_0", "kivi2", "kivi4"};
    return v;
}

}  // namespace kv
