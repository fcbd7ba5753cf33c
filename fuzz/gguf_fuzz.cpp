// libFuzzer target for the GGUF reader's pure layers: container parser, tokenizer metadata,
// model-config mapping, tensor-name mapping and dequantization of whatever tensors parse.
// Any input must end in success or kv::Error — never a crash, leak, hang or sanitizer report.
// fuzz-sources: formats/gguf/gguf_parse.cpp formats/gguf/gguf_value.cpp formats/gguf/gguf_types.cpp formats/gguf/gguf_dequant.cpp formats/gguf/gguf_tokenizer_data.cpp formats/gguf/gguf_config.cpp formats/gguf/gguf_names.cpp formats/gguf/gguf_rope_permute.cpp engine/core/error.cpp
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "formats/gguf/gguf_config.h"
#include "formats/gguf/gguf_dequant.h"
#include "formats/gguf/gguf_names.h"
#include "formats/gguf/gguf_parse.h"
#include "formats/gguf/gguf_rope_permute.h"
#include "formats/gguf/gguf_tokenizer_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    kv::GgufFile f;
    try {
        f = kv::gguf_parse(data, size, "fuzz.gguf");
    } catch (const kv::Error&) {
        return 0;
    }
    try {
        kv::GgufTokenizerData tok = kv::gguf_tokenizer_data(f);
        kv::ModelConfig c = kv::gguf_model_config(f, tok);
        for (const kv::GgufTensorInfo& t : f.tensors) {
            kv::GgufHfName n = kv::gguf_to_hf_name(t.name);
            if (!n.hf.empty() && t.n_dims == 2 && n.hf.find("q_proj.weight") != std::string::npos)
                (void)kv::gguf_unpermute_rows(t.n_rows(), c.num_heads, t.name);
        }
    } catch (const kv::Error&) {
    }
    // Dequantize (a bounded prefix of) every tensor the parser accepted: its bytes are inside
    // the buffer, so this must never read out of bounds.
    std::vector<float> out;
    for (const kv::GgufTensorInfo& t : f.tensors) {
        if (!kv::gguf_can_dequantize(t.type) || t.ne[0] == 0) continue;
        const int64_t rows = std::min<int64_t>(t.n_rows(), std::max<int64_t>(1, 65536 / t.ne[0]));
        if (t.ne[0] > (int64_t(1) << 20)) continue;  // keep one input's work small
        out.resize(size_t(rows * t.ne[0]));
        try {
            kv::gguf_dequantize_rows(t.type, data + t.file_offset, rows, t.ne[0], kv::DType::F32, out.data());
        } catch (const kv::Error&) {
        }
    }
    return 0;
}
