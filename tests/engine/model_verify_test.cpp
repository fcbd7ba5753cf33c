// --model.verify (issue 17): SHA-256 against FIPS 180-2's "abc" vector, a sidecar that agrees,
// one that disagrees, a missing one, and load_model refusing a file whose sidecar disagrees
// before it parses anything.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include "engine/core/error.h"
#include "formats/io/hf_folder.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/model/model_verify.h"

namespace kv::test {
namespace {

struct Dir {
    std::string path;
    Dir() {
        std::string t = (std::filesystem::temp_directory_path() / "kvlab-verify-XXXXXX").string();
        path = mkdtemp(t.data());
    }
    ~Dir() { std::filesystem::remove_all(path); }
    std::string file(const std::string& n, const std::string& bytes) const {
        std::ofstream(path + "/" + n, std::ios::binary) << bytes;
        return path + "/" + n;
    }
};

std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(ModelVerify, Sha256AndSidecars) {
    Dir d;
    const std::string f = d.file("m.gguf", "abc");
    EXPECT_EQ(file_sha256(f), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_NE(error_of([&] { verify_model_checksum(f); }).find("m.gguf.sha256 is missing"), std::string::npos);
    d.file("m.gguf.sha256", "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD  m.gguf\n");
    EXPECT_EQ(error_of([&] { verify_model_checksum(f); }), "");
    d.file("m.gguf.sha256", std::string(64, '0') + "  m.gguf\n");
    EXPECT_NE(error_of([&] { verify_model_checksum(f); }).find("has SHA-256 ba7816bf"), std::string::npos);
    d.file("m.gguf.sha256", "not a checksum\n");
    EXPECT_NE(error_of([&] { verify_model_checksum(f); }).find("does not start with a 64-digit hex SHA-256"),
              std::string::npos);
}

TEST(ModelVerify, LoadModelRefusesAFileItsChecksumDisagreesWith) {
    const std::string model = std::string(KVLAB_SOURCE_DIR) + "/assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " is absent (scripts/fetch_assets.sh)";
    Dir d;
    const std::string link = d.path + "/smol.gguf";
    ASSERT_EQ(symlink(model.c_str(), link.c_str()), 0);
    d.file("smol.gguf.sha256", std::string(64, 'f') + "  smol.gguf\n");
    ModelOptions opt;
    opt.verify_checksum = true;
    const std::string msg = error_of([&] { load_model(link, opt, 0); });
    EXPECT_NE(msg.find("--model.verify: " + link + " has SHA-256 "), std::string::npos) << msg;
    EXPECT_NE(msg.find("the file is damaged"), std::string::npos) << msg;
}

// Bit flips in a Hugging Face folder's weights (issue 17: values above 1e6 used to load and run)
// are refused by load_model, naming the tensor.
TEST(ModelVerify, FlippedExponentBitsInHfWeightsAreRefused) {
    Dir d;
    const ModelConfig cfg = preset_config("tiny");
    TensorMap w = random_weights(cfg, 9, DType::F32);
    write_hf_model_folder(d.path, cfg, w);
    EXPECT_EQ(error_of([&] { load_model(d.path, ModelOptions{}, 0); }), "");
    const std::string name = "model.layers.0.mlp.up_proj.weight";
    ASSERT_TRUE(w.count(name));
    float* p = w.at(name).data<float>();
    uint32_t bits;
    std::memcpy(&bits, p + 11, 4);
    bits ^= 0x40000000u;  // the top exponent bit: |x| <~ 1 becomes ~1e38
    std::memcpy(p + 11, &bits, 4);
    write_hf_model_folder(d.path, cfg, w);
    const std::string msg = error_of([&] { load_model(d.path, ModelOptions{}, 0); });
    EXPECT_NE(msg.find(d.path + ": tensor '" + name + "' element 11 "), std::string::npos) << msg;
    EXPECT_NE(msg.find("beyond the plausible weight magnitude"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kv::test
