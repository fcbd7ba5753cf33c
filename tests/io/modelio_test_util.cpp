// Model I/O test helpers (see modelio_test_util.h).
#include "modelio_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "formats/io/weight_names.h"
#include "tests/support/test_support.h"

namespace kv::test {

namespace fs = std::filesystem;

TempDir::TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kvlab_modelio_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::vector<std::string> list_dir(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

std::string le_u64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint8_t(v >> (8 * i)));
    return s;
}

std::string st_bytes(const std::string& header, const std::string& data) { return le_u64(header.size()) + header + data; }

::testing::AssertionResult contains_all(const std::string& msg, std::initializer_list<const char*> needles) {
    for (const char* n : needles)
        if (msg.find(n) == std::string::npos)
            return ::testing::AssertionFailure() << "message lacks \"" << n << "\": " << msg;
    return ::testing::AssertionSuccess();
}

ModelConfig tiny_config(Arch arch) {
    ModelConfig c;
    c.arch = arch;
    c.model_type = arch_name(arch);
    c.name = std::string("tiny-") + arch_name(arch);
    c.vocab_size = 48;
    c.hidden_size = 32;
    c.intermediate_size = 40;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 64;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    switch (arch) {
        case Arch::LLAMA: break;
        case Arch::MISTRAL: c.sliding_window = 16; break;
        case Arch::QWEN2:
            c.qkv_bias = true;
            c.tie_word_embeddings = true;
            break;
        case Arch::QWEN3:
            c.qk_norm = true;
            c.head_dim = 16;  // deliberately != hidden / heads, as in real Qwen3 models
            c.tie_word_embeddings = true;
            break;
        case Arch::GPT2:
            c.num_kv_heads = c.num_heads;
            c.qkv_bias = c.o_bias = c.mlp_bias = true;
            c.tie_word_embeddings = true;
            break;
        case Arch::GEMMA2:
        case Arch::GEMMA3:
            c.norm_placement = NormPlacement::BOTH;
            c.norm_weight_offset = 1.0;
            c.embedding_scale = std::sqrt(double(c.hidden_size));
            c.mlp_act = MlpAct::GELU_TANH;
            c.qk_norm = arch == Arch::GEMMA3;
            c.tie_word_embeddings = true;
            break;
        case Arch::SMOLLM3: break;
        case Arch::PHI3: c.fused_projections = true; break;
        case Arch::OLMO2:
            c.norm_placement = NormPlacement::POST;
            c.qk_norm = c.qk_norm_whole = true;
            break;
        case Arch::GPT_OSS:
            c.attention_sinks = true;
            c.qkv_bias = c.o_bias = true;
            break;
        case Arch::LFM2:  // layer 0 a short convolution of width 3, layer 1 attention with q/k norm
            c.qk_norm = true;
            c.tie_word_embeddings = true;
            c.conv_kernel = 3;
            c.layer_specs.resize(2);
            c.layer_specs[0].mixer = LayerMixer::SHORT_CONV;
            c.layer_specs[0].attention = AttnKind::NONE;
            break;
        case Arch::DEEPSEEK_V2:  // latent attention: keys of 4 + 4 rotated channels, values of 6, latents 12 and 10
            c.num_kv_heads = c.num_heads;
            c.attn_projection = AttnProjection::LATENT;
            c.latent.q_lora_rank = 12;
            c.latent.kv_lora_rank = 10;
            c.latent.qk_nope_head_dim = 4;
            c.latent.qk_rope_head_dim = 4;
            c.latent.v_head_dim = 6;
            c.head_dim = 8;
            c.partial_rotary_factor = 0.5;
            break;
        case Arch::GEMMA3N:  // 2 AltUp streams, LAUREL rank 2, per-layer inputs of 4; layer 1 reads layer 0's K/V
            c.norm_placement = NormPlacement::BOTH;
            c.embedding_scale = std::sqrt(double(c.hidden_size));
            c.mlp_act = MlpAct::GELU_TANH;
            c.qk_norm = c.v_norm = true;
            c.query_pre_attn_scalar = 1.0;
            c.tie_word_embeddings = true;
            c.altup.num_inputs = 2;
            c.altup.laurel_rank = 2;
            c.altup.per_layer_dim = 4;
            c.altup.per_layer_vocab = c.vocab_size;
            c.layer_specs.resize(2);
            c.layer_specs[1].kv_source = 0;
            break;
    }
    return c;
}

TensorMap tiny_weights(const ModelConfig& cfg, DType dtype, uint64_t seed) {
    std::mt19937_64 rng(seed);
    TensorMap w;
    for (const WeightSpec& s : expected_weight_shapes(cfg)) {
        if (s.optional) continue;
        w[s.name] = random_tensor(s.shape, dtype, rng, -1.0, 1.0, TensorOptions{Device{}, MemCategory::WEIGHTS, s.name});
    }
    return w;
}

}  // namespace kv::test
