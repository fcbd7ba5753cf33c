// The buffer table (see kv_names.h).
#include "kv_names.h"

namespace kv {

const std::vector<BufferInfo>& kv_buffer_registry() {
    using K = BufferKind;
    static const std::vector<BufferInfo> r = {
        {.name = "default"},
        {.name = "f32", .dtype = DType::F32},
        {.name = "bf16", .dtype = DType::BF16},
        {.name = "f16", .dtype = DType::F16},
        {.name = "q8", .kind = K::QUANTIZED, .bits = 8, .aliases = {"torch-quantized8"}},
        {.name = "q4", .kind = K::QUANTIZED, .bits = 4, .aliases = {"torch-quantized4"}},
        {.name = "nf4", .kind = K::QUANTIZED, .bits = 4},
        {.name = "q8_0", .kind = K::QUANTIZED, .bits = 8},
        {.name = "q4_0", .kind = K::QUANTIZED, .bits = 4},
        // vLLM's --kv-cache-dtype spellings; "fp8" is E4M3 there too
        {.name = "fp8_e4m3", .kind = K::QUANTIZED, .bits = 8, .aliases = {"fp8-e4m3", "fp8"}},
        {.name = "fp8_e5m2", .kind = K::QUANTIZED, .bits = 8, .aliases = {"fp8-e5m2"}},
        {.name = "nvfp4", .kind = K::QUANTIZED, .bits = 4},
        {.name = "mxfp4", .kind = K::QUANTIZED, .bits = 4},
        // asymmetric K/V widths: keys keep more bits than values (errors in keys move every
        // attention weight; a value's error stays in its own token's share)
        {.name = "k8v4", .kind = K::QUANTIZED, .bits = 6, .key_format = "q8", .value_format = "q4"},
        {.name = "k8v4_0", .kind = K::QUANTIZED, .bits = 6, .key_format = "q8_0", .value_format = "q4_0"},
        {.name = "kfp8vfp4", .kind = K::QUANTIZED, .bits = 6, .key_format = "fp8_e4m3", .value_format = "nvfp4"},
        // vLLM's TurboQuant: a seeded Hadamard rotation, then Lloyd-Max codes for keys and uniform
        // codes for values (kernels/common/quant_formats.h TQK/TQV); widths by key_bits / value_bits
        {.name = "turboquant", .kind = K::QUANTIZED, .bits = 4, .key_format = "tqk4", .value_format = "tqv4"},
        {.name = "kivi2", .kind = K::KIVI, .bits = 2},
        {.name = "kivi4", .kind = K::KIVI, .bits = 4},
        // ThinK's pruned key channels, stored in the activation dtype (engine/kv/buffers/buffer_think.cpp)
        {.name = "think", .kind = K::THINK},
    };
    return r;
}

const BufferInfo* find_buffer(const std::string& name) {
    for (const BufferInfo& b : kv_buffer_registry()) {
        if (b.name == name) return &b;
        for (const std::string& a : b.aliases)
            if (a == name) return &b;
    }
    return nullptr;
}

const std::vector<std::string>& kv_buffer_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const BufferInfo& b : kv_buffer_registry()) v.push_back(b.name);
        return v;
    }();
    return names;
}

std::string kv_buffer_aliases_text() {
    std::string s;
    for (const BufferInfo& b : kv_buffer_registry())
        for (const std::string& a : b.aliases) s += (s.empty() ? "" : ", ") + a + " = " + b.name;
    return s;
}

}  // namespace kv
