// `kvlab compare` shows logical (slots kept) beside physical (blocks held) KV bytes where the
// runs' summaries record them, and leaves the section out for runs that do not.
#include <gtest/gtest.h>

#include "storage/comparison.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage_test_util.h"

namespace kv {
namespace {

TEST(KVMemoryCompare, LogicalAndPhysicalBytesSideBySide) {
    test::ScratchDir dir;
    const std::string path = dir.file("bytes.kvlab");
    auto s = storage::Session::create(path);
    const int64_t a = s->create_run("paged", R"({"mode":"eval_long","kv_cache":{"name":"h2o-default","cache_length":40}})");
    const int64_t b = s->create_run("compact", R"({"mode":"eval_long","kv_cache":{"name":"h2o-default","cache_length":48}})");
    const int64_t old = s->create_run("old", R"({"mode":"eval_long","kv_cache":{"name":"h2o-default","cache_length":56}})");
    s->merge_summary(a, R"({"kv_bytes":65536,"kv_logical_bytes":40960,"kv_physical_bytes":49152})");
    s->merge_summary(b, R"({"kv_bytes":65536,"kv_logical_bytes":49152,"kv_physical_bytes":49152})");
    s->merge_summary(old, R"({"kv_bytes":65536})");
    storage::SessionReader reader(path);
    const storage::Comparison c = storage::compare_runs(reader, {a, b}, a);
    ASSERT_EQ(c.runs.size(), 2u);
    EXPECT_EQ(c.runs[0].kv_logical_bytes, 40960.0);
    EXPECT_EQ(c.runs[0].kv_physical_bytes, 49152.0);
    EXPECT_EQ(c.runs[1].kv_logical_bytes, 49152.0);
    const std::string text = storage::format_comparison(c);
    const size_t at = text.find("KV memory (logical: slots kept; physical: blocks held)");
    ASSERT_NE(at, std::string::npos) << text;
    const size_t logical = text.find("logical bytes", at), physical = text.find("physical bytes", at);
    ASSERT_NE(logical, std::string::npos) << text;
    ASSERT_NE(physical, std::string::npos) << text;
    EXPECT_LT(logical, physical);
    // Runs written before the fields existed: no section.
    const std::string without = storage::format_comparison(storage::compare_runs(reader, {old, a}, old));
    EXPECT_NE(without.find("KV memory"), std::string::npos);  // run a has them
    EXPECT_EQ(storage::format_comparison(storage::compare_runs(reader, {old}, old)).find("KV memory"), std::string::npos);
}

}  // namespace
}  // namespace kv
