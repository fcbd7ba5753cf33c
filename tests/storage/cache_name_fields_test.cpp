// Storage reads stored cache names through the one parser (engine/core/cache_name.h), so a
// session whose config holds keys_values' alias ("h2o-torch-quantized8", as sessions written
// before the run options stored names canonically do) lists, compares and labels that run as
// policy h2o, buffer q8 — the same identity as a run stored as "h2o-q8". Storage links the core
// alone: this suite has no policy registry, and the split still agrees with the engine's.
#include <gtest/gtest.h>

#include "storage/comparison.h"
#include "storage/config_fields.h"
#include "storage/run_experiment.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage_test_util.h"

namespace kv {
namespace {

const char* kAliasNested = R"({"mode":"eval_long","kv_cache":{"name":"h2o-torch-quantized8","cache_length":64}})";
const char* kAliasFlat = R"({"mode":"eval_long","kv_cache.name":"h2o-orig-torch-quantized4"})";

TEST(CacheNameFields, StoredAliasesReadCanonically) {
    EXPECT_EQ(storage::run_config_value(kAliasNested, "kv_cache.name"), "h2o-q8");
    EXPECT_EQ(storage::run_config_value(kAliasFlat, "kv_cache.name"), "h2o-orig-q4");
    EXPECT_EQ(storage::run_cache_name(kAliasNested), (CacheName{"h2o", "q8"}));
    EXPECT_EQ(storage::run_cache_name(kAliasFlat), (CacheName{"h2o-orig", "q4"}));
    EXPECT_EQ(storage::run_policy(kAliasNested), "h2o");
    EXPECT_EQ(storage::flat_run_config(kAliasNested).at("kv_cache.name"), "h2o-q8");
    // Canonical names are unchanged; multi-dash policies keep their dashes.
    EXPECT_EQ(storage::run_cache_name(R"({"kv_cache":{"name":"smart-lastrec-kivi2"}})"), (CacheName{"smart-lastrec", "kivi2"}));
    EXPECT_EQ(storage::canonical_cache_name("qh2o-vlen-nf4"), "qh2o-vlen-nf4");
    // No cache name: nothing; a name without a known buffer: as the engine reads it, unchanged as text.
    EXPECT_EQ(storage::run_cache_name(R"({"mode":"eval_long"})"), std::nullopt);
    EXPECT_EQ(storage::run_cache_name("[1,2"), std::nullopt);
    EXPECT_EQ(storage::run_cache_name(R"({"kv_cache":{"name":"mystery"}})"), (CacheName{"mystery", "default"}));
    EXPECT_EQ(storage::run_config_value(R"({"kv_cache":{"name":"mystery"}})", "kv_cache.name"), "mystery");
}

TEST(CacheNameFields, AnAliasAndItsCanonicalNameAreOneExperiment) {
    // Two runs of one cache, one stored with the alias: same identity, nothing tells them apart.
    const std::vector<storage::FlatConfig> configs = {storage::flat_run_config(kAliasNested),
                                                      storage::flat_run_config(R"({"mode":"eval_long","kv_cache":{"name":"h2o-q8","cache_length":64}})")};
    EXPECT_TRUE(storage::differing_fields(configs, {}).empty());
}

TEST(CacheNameFields, CompareShowsTheCanonicalName) {
    test::ScratchDir dir;
    const std::string path = dir.file("alias.kvlab");
    auto s = storage::Session::create(path);
    const int64_t alias = s->create_run("alias", kAliasNested);
    const int64_t other = s->create_run("lastrec", R"({"mode":"eval_long","kv_cache":{"name":"lastrec-default","cache_length":64}})");
    const int64_t same = s->create_run("canonical", R"({"mode":"eval_long","kv_cache":{"name":"h2o-q8","cache_length":64}})");
    storage::SessionReader reader(path);
    const storage::Comparison c = storage::compare_runs(reader, {alias, other}, alias);
    ASSERT_EQ(c.differing_fields, std::vector<std::string>{"kv_cache.name"});
    ASSERT_EQ(c.runs.size(), 2u);
    EXPECT_EQ(c.runs[0].config_diff.at(0), (std::pair<std::string, std::string>{"kv_cache.name", "h2o-q8"}));
    EXPECT_EQ(c.runs[1].config_diff.at(0), (std::pair<std::string, std::string>{"kv_cache.name", "lastrec-default"}));
    EXPECT_NE(storage::format_comparison(c).find("h2o-q8"), std::string::npos);
    EXPECT_EQ(storage::format_comparison(c).find("torch-quantized"), std::string::npos);
    // The alias run and the canonical run differ in nothing.
    EXPECT_TRUE(storage::compare_runs(reader, {alias, same}, alias).differing_fields.empty());
}

}  // namespace
}  // namespace kv
