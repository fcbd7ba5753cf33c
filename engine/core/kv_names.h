// The one table of KV cache buffers (the {buffer} half of "{policy}-{buffer}", keys_values'
// naming): one entry per buffer, read by every layer that builds, validates, splits or lists
// them (engine/kv builds caches, engine/core/cache_name.h parses names, the run form and
// compare dialog list them). It lives in the core, not beside the policy registry in
// engine/kv, because storage (core only) splits stored names by it. Policy names come from the
// policy registry (engine/kv/policies/policy_registry.h: kv_policy_names()).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kernels/common/dtype.h"

namespace kv {

enum class BufferKind {
    FULL,       // plain K/V tensors (paged and offloadable)
    QUANTIZED,  // rows in a kernels/common/quant_formats.h format, named like the buffer
    KIVI,       // KIVI's per-channel keys / per-token values, `bits` per code
    THINK,      // ThinK: keys keep only some channels per KV head (key_channel_ratio), values all D
};

struct BufferInfo {
    std::string name = {};  // canonical spelling; never contains '-' (aliases may)
    BufferKind kind = BufferKind::FULL;
    std::optional<DType> dtype = {};        // FULL: its element type; none = the run's activation dtype
    int bits = 0;                           // QUANTIZED, KIVI: bits per code
    std::vector<std::string> aliases = {};  // other accepted spellings (keys_values'), stored canonically
    // QUANTIZED with different key and value widths (llama.cpp's -ctk/-ctv): the quant formats of
    // keys and values; empty: both are the buffer's own name.
    std::string key_format = {}, value_format = {};

    const std::string& keys_format() const { return key_format.empty() ? name : key_format; }
    const std::string& values_format() const { return value_format.empty() ? name : value_format; }

    // K/V exactly as the model computed them (full precision in the activation dtype: "default").
    bool same_as_activations() const { return kind == BufferKind::FULL && !dtype; }
};

// Every buffer, in display order ("default" first).
const std::vector<BufferInfo>& kv_buffer_registry();
// The buffer named `name` or one of its aliases; nullptr when unknown.
const BufferInfo* find_buffer(const std::string& name);
// The canonical names of kv_buffer_registry(), in order.
const std::vector<std::string>& kv_buffer_names();
// "torch-quantized8 = q8, torch-quantized4 = q4": the aliases, for messages and help.
std::string kv_buffer_aliases_text();

}  // namespace kv
