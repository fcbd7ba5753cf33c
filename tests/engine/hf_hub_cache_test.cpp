// Hugging Face repo ids resolve from a local hub cache laid out as the hub client writes it
// (refs/<revision> -> commit, snapshots/<commit>/<file> -> ../../blobs/<hash>); the model
// loaded by id computes the fixture's PyTorch logits, and an id that is not cached is refused
// with every folder looked in and the command that fetches it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/core/error.h"
#include "formats/io/hf_hub_cache.h"
#include "formats/io/safetensors_file.h"
#include "engine/model/model_loader.h"
#include "engine/model/transformer.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

namespace fs = std::filesystem;

const char* kCommit = "0123456789abcdef0123456789abcdef01234567";

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
   public:
    ScopedEnv(const char* name, const std::string& value) : name_(name) {
        if (const char* v = std::getenv(name)) old_ = v, had_ = true;
        ::setenv(name, value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (had_) ::setenv(name_, old_.c_str(), 1);
        else ::unsetenv(name_);
    }

   private:
    const char* name_;
    std::string old_;
    bool had_ = false;
};

// A hub cache holding `fixture` as kvlab-test/<fixture>, files as links into blobs/.
fs::path make_hub_cache(const std::string& fixture) {
    const fs::path root = fs::temp_directory_path() / ("kvlab_hub_" + std::to_string(::getpid()));
    fs::remove_all(root);
    const fs::path repo = root / ("models--kvlab-test--" + fixture);
    fs::create_directories(repo / "refs");
    fs::create_directories(repo / "blobs");
    fs::create_directories(repo / "snapshots" / kCommit);
    std::ofstream(repo / "refs" / "main") << kCommit;  // the hub writes no newline
    std::ofstream(repo / "refs" / "v1") << kCommit << "\n";
    const fs::path src = fs::path(KVLAB_SOURCE_DIR) / "tests/fixtures/models" / fixture;
    int n = 0;
    for (const char* f : {"config.json", "model.safetensors"}) {
        const fs::path blob = repo / "blobs" / ("blob" + std::to_string(n++));
        fs::copy_file(src / f, blob);
        fs::create_symlink(fs::path("../../blobs") / blob.filename(), repo / "snapshots" / kCommit / f);
    }
    return root;
}

TEST(HfHubCache, RepoIdShapes) {
    EXPECT_TRUE(looks_like_hf_repo_id("Qwen/Qwen3-0.6B"));
    EXPECT_TRUE(looks_like_hf_repo_id("HuggingFaceTB/SmolLM2-135M@main"));
    EXPECT_FALSE(looks_like_hf_repo_id("tiny"));
    EXPECT_FALSE(looks_like_hf_repo_id("/abs/path"));
    EXPECT_FALSE(looks_like_hf_repo_id("./models/x"));
    EXPECT_FALSE(looks_like_hf_repo_id("a/b/c"));
    EXPECT_FALSE(looks_like_hf_repo_id("org/"));
    EXPECT_FALSE(looks_like_hf_repo_id("org/na me"));
}

TEST(HfHubCache, AModelLoadedByIdComputesTheReferenceLogits) {
    const fs::path cache = make_hub_cache("llama_gqa");
    ScopedEnv hub("HF_HUB_CACHE", cache.string());
    const std::string snapshot = (cache / "models--kvlab-test--llama_gqa" / "snapshots" / kCommit).string();
    EXPECT_EQ(resolve_hf_repo_id("kvlab-test/llama_gqa"), snapshot);
    EXPECT_EQ(resolve_hf_repo_id("kvlab-test/llama_gqa@v1"), snapshot) << "a tag's ref file may end in a newline";
    EXPECT_EQ(resolve_hf_repo_id(std::string("kvlab-test/llama_gqa@") + kCommit), snapshot) << "a commit is a revision";

    ModelOptions opt;
    LoadedModel lm = load_model("kvlab-test/llama_gqa", opt);
    EXPECT_EQ(lm.source, snapshot);
    // The fixture's expected logits are float64 PyTorch (tools/reference/model_reference.py).
    const SafetensorsContents expected =
        load_safetensors(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/llama_gqa/expected.safetensors");
    lm.model->set_context_width(std::stoll(expected.metadata.at("context_width")));
    const Tensor& ids = expected.tensors.at("input_ids.0");
    test::Comparison c = test::compare(lm.model->forward(ids), expected.tensors.at("logits.0"));
    EXPECT_LE(c.rel_err, 1e-5) << c.report;
    fs::remove_all(cache);
}

TEST(HfHubCache, AnIdNotCachedSaysWhereItLookedAndHowToFetch) {
    const fs::path cache = make_hub_cache("llama_gqa");
    ScopedEnv hub("HF_HUB_CACHE", cache.string());
    ScopedEnv home("HF_HOME", (cache / "hf_home").string());
    try {
        load_model("Qwen/Qwen3-0.6B", ModelOptions{});
        FAIL() << "an id that is not cached was loaded";
    } catch (const Error& e) {
        const std::string what = std::string(e.what()) + " " + e.hint();
        EXPECT_NE(what.find("Qwen/Qwen3-0.6B"), std::string::npos) << what;
        EXPECT_NE(what.find((cache / "models--Qwen--Qwen3-0.6B").string()), std::string::npos) << what;
        EXPECT_NE(what.find((cache / "hf_home" / "hub" / "models--Qwen--Qwen3-0.6B").string()), std::string::npos) << what;
        EXPECT_NE(what.find("hf download Qwen/Qwen3-0.6B"), std::string::npos) << what;
    }
    // A revision the cache lacks is named too.
    try {
        resolve_hf_repo_id("kvlab-test/llama_gqa@v2");
        FAIL() << "a missing revision resolved";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no refs/v2"), std::string::npos) << e.what();
    }
    fs::remove_all(cache);
}

}  // namespace
}  // namespace kv
