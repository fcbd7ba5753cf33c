// Deterministic random-input loops over the parsers (separate from the libFuzzer targets, so
// every ctest run covers them): random bytes, mutated valid files and token soups must yield
// either a valid result or a kv::Error — never a crash or another exception type.
#include <gtest/gtest.h>

#include <random>

#include "formats/io/hf_config.h"
#include "formats/io/safetensors_file.h"
#include "formats/io/safetensors_index.h"
#include "formats/io/safetensors_parse.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

const char* kTokens[] = {"{", "}", "[", "]", ":", ",", " ", "\"a\"", "\"b\"", "\"dtype\"", "\"shape\"",
                         "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"BF16\"", "\"F4\"", "\"I8\"", "0", "4",
                         "8", "-1", "1e3", "18446744073709551615", "null", "true", "\"\\u0000\"", "\"\xc3\xa9\"", "\xff"};

std::string token_soup(std::mt19937_64& rng, size_t n) {
    std::string s = "{";
    for (size_t i = 0; i < n; ++i) s += kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))];
    return s;
}

std::string mutate(std::string s, std::mt19937_64& rng) {
    if (s.empty()) return s;
    switch (rng() % 5) {
        case 0:  // flip bytes
            for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) s[rng() % s.size()] ^= char(1u << (rng() % 8));
            break;
        case 1: s.resize(rng() % s.size()); break;  // truncate
        case 2: s.insert(rng() % s.size(), std::string(1 + rng() % 8, char(rng()))); break;
        case 3: s.erase(rng() % s.size(), 1 + rng() % 8); break;
        default: s[rng() % s.size()] = "{}[]\":,0-9 x"[rng() % 13]; break;
    }
    return s;
}

// The invariants every accepted header must satisfy.
void check_accepted(const SafetensorsHeader& h, size_t size) {
    ASSERT_EQ(h.data_offset + h.data_size, size);
    uint64_t pos = 0;
    for (const auto& e : h.entries) {
        ASSERT_EQ(e.begin, pos);
        ASSERT_LE(e.begin, e.end);
        pos = e.end;
    }
    ASSERT_EQ(pos, h.data_size);
}

std::string valid_file() {
    std::string header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
        "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[22,23]}}";
    return test::st_bytes(header, std::string(23, '\x01'));
}

TEST(ParserRobustness, SafetensorsHeaderNeverCrashes) {
    std::mt19937_64 rng(20240611);  // fixed: this loop is a regression test, not a fuzzer
    const std::string valid = valid_file();
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 20000; ++iter) {
        std::string b;
        switch (iter % 4) {
            case 0:
                b.resize(rng() % 64);
                for (auto& c : b) c = char(rng());
                break;
            case 1: {
                std::string soup = token_soup(rng, rng() % 24);
                b = test::st_bytes(soup, std::string(rng() % 24, '\0'));
                break;
            }
            case 2: b = mutate(valid, rng); break;
            default: b = mutate(mutate(valid, rng), rng); break;
        }
        try {
            SafetensorsHeader h = parse_safetensors_header(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "random");
            check_accepted(h, b.size());
            ++accepted;
        } catch (const Error&) {
            ++rejected;
        }
    }
    EXPECT_GT(accepted, 100);  // mutations of the data section stay valid
    EXPECT_GT(rejected, 10000);
}

TEST(ParserRobustness, SafetensorsLoaderNeverCrashes) {
    std::mt19937_64 rng(77);
    test::TempDir dir;
    const std::string valid = valid_file();
    std::string path = dir.file("r.safetensors");
    for (int iter = 0; iter < 300; ++iter) {
        test::write_bytes(path, mutate(valid, rng));
        try {
            SafetensorsContents c = load_safetensors(path);
            for (const auto& [name, t] : c.tensors) (void)t.to_f64_vector();  // touch every mapped byte
        } catch (const Error&) {
        }
    }
}

const char* kConfigs[] = {
    R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":128,"hidden_size":64,
        "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
        "max_position_embeddings":256,"rms_norm_eps":1e-5,"rope_theta":500000.0,"tie_word_embeddings":true,
        "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
        "original_max_position_embeddings":64},"bos_token_id":1,"eos_token_id":[2,3],"torch_dtype":"bfloat16"})",
    R"({"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","vocab_size":128,"hidden_size":64,"head_dim":32,
        "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
        "max_position_embeddings":256,"sliding_window":null,"use_sliding_window":false,"eos_token_id":5})",
    R"({"model_type":"gpt2","vocab_size":100,"n_embd":32,"n_head":4,"n_layer":2,"n_positions":64,"n_inner":null})",
};

TEST(ParserRobustness, ConfigParserNeverCrashes) {
    std::mt19937_64 rng(4242);
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 6000; ++iter) {
        std::string text = kConfigs[iter % 3];
        for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) text = mutate(text, rng);
        try {
            ModelConfig c = parse_model_config(text, "random.json");
            ++accepted;
            // Whatever we accept must survive our own writer and reader unchanged.
            ModelConfig again = parse_model_config(model_config_to_json(c), "again.json");
            EXPECT_EQ(model_config_to_json(again), model_config_to_json(c));
            apply_generation_config(text, "random_gen.json", c);
        } catch (const Error&) {
            ++rejected;
        }
        try {
            parse_safetensors_index(text, "random.index.json");
        } catch (const Error&) {
        }
    }
    EXPECT_GT(accepted, 100);
    EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace kv
