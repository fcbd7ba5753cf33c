// The one cache name parser and printer (engine/core/cache_name.h) and the buffer table
// (engine/core/kv_names.h): every registered policy x buffer prints and parses back, every
// alias reads as its buffer's canonical name, bad names give one message listing what is
// valid, and the run options (flags and JSON) store the canonical spelling.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "engine/core/cache_name.h"
#include "engine/core/error.h"
#include "engine/core/kv_names.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/run/run_config.h"

namespace kv::test {
namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

TEST(CacheName, EveryPolicyTimesBufferPrintsAndParsesBack) {
    for (const std::string& p : kv_policy_names())
        for (const std::string& b : kv_buffer_names()) {
            const CacheName n{p, b};
            EXPECT_EQ(n.text(), p + "-" + b);  // the printer: policy, one dash, buffer
            EXPECT_EQ(parse_kv_cache_name(n.text()), n) << n.text();
            EXPECT_EQ(read_cache_name(n.text()), n) << n.text();  // the reader splits the same way
            KVCacheConfig c;
            c.name = n.text();
            EXPECT_EQ(c.cache_name(), n);
        }
}

TEST(CacheName, BufferTableIsOneEntryPerNameWithoutDashes) {
    std::set<std::string> spellings;
    for (const BufferInfo& b : kv_buffer_registry()) {
        EXPECT_EQ(b.name.find('-'), std::string::npos) << b.name;  // a canonical name splits at the last dash
        EXPECT_TRUE(spellings.insert(b.name).second) << "repeated: " << b.name;
        for (const std::string& a : b.aliases) EXPECT_TRUE(spellings.insert(a).second) << "repeated: " << a;
        EXPECT_EQ(find_buffer(b.name), &b);
        // bits per code exactly for packed buffers (think stores the activation dtype, fewer key channels)
        EXPECT_EQ(b.kind == BufferKind::QUANTIZED || b.kind == BufferKind::KIVI, b.bits > 0) << b.name;
    }
    // Policies that restrict their buffers name registered ones.
    for (const PolicyInfo& p : policy_registry())
        for (const std::string& b : p.buffers) EXPECT_NE(find_buffer(b), nullptr) << p.name << " lists unknown buffer " << b;
}

TEST(CacheName, AliasesMapToTheirCanonicalNames) {
    // keys_values' spellings, written out: the table must keep them.
    EXPECT_EQ(parse_kv_cache_name("h2o-torch-quantized8"), (CacheName{"h2o", "q8"}));
    EXPECT_EQ(parse_kv_cache_name("h2o-orig-torch-quantized4"), (CacheName{"h2o-orig", "q4"}));
    EXPECT_EQ(parse_kv_cache_name("h2o-torch-quantized8").text(), "h2o-q8");
    int aliases = 0;
    for (const BufferInfo& b : kv_buffer_registry())
        for (const std::string& a : b.aliases) {
            ++aliases;
            for (const std::string& p : kv_policy_names()) {
                EXPECT_EQ(parse_kv_cache_name(p + "-" + a), (CacheName{p, b.name})) << p << "-" << a;
                EXPECT_EQ(read_cache_name(p + "-" + a), (CacheName{p, b.name})) << p << "-" << a;
            }
        }
    EXPECT_EQ(aliases, 5);  // torch-quantized8, torch-quantized4; vLLM's fp8-e4m3, fp8, fp8-e5m2
    EXPECT_EQ(parse_kv_cache_name("h2o-fp8-e4m3"), (CacheName{"h2o", "fp8_e4m3"}));
    EXPECT_EQ(parse_kv_cache_name("h2o-orig-fp8"), (CacheName{"h2o-orig", "fp8_e4m3"}));
    EXPECT_EQ(parse_kv_cache_name("h2o-fp8-e5m2").text(), "h2o-fp8_e5m2");
}

TEST(CacheName, BadNamesListThePoliciesAndBuffers) {
    for (const std::string bad : {"bogus-default", "h2o-q5", "h2o", "", "-q8", "h2o-", "torch-quantized8"}) {
        const std::string msg = error_of([&] { parse_kv_cache_name(bad); });
        EXPECT_EQ(msg.rfind("--kv_cache.name: '" + bad + "' is not {policy}-{buffer}", 0), 0u) << msg;
        for (const std::string& p : kv_policy_names()) EXPECT_NE(msg.find(p), std::string::npos) << bad << ": " << msg;
        for (const std::string& b : kv_buffer_names()) EXPECT_NE(msg.find(b), std::string::npos) << bad << ": " << msg;
        EXPECT_NE(msg.find("torch-quantized8 = q8"), std::string::npos) << msg;
        EXPECT_FALSE(read_cache_name(bad) && bad != "bogus-default") << bad;  // only bogus-default has a buffer suffix
    }
    EXPECT_NE(error_of([] { parse_kv_cache_name("bogus-default"); }).find("unknown policy 'bogus'"), std::string::npos);
    EXPECT_NE(error_of([] { parse_kv_cache_name("h2o-orig-q5"); }).find("unknown buffer 'q5'"), std::string::npos);
}

TEST(CacheName, RunOptionsStoreTheCanonicalSpelling) {
    RunConfig c;
    set_run_option(c, "kv_cache.name", "h2o-torch-quantized8");
    EXPECT_EQ(c.kv_cache.name, "h2o-q8");
    EXPECT_EQ(c.kv_cache.policy(), "h2o");
    EXPECT_EQ(c.kv_cache.buffer(), "q8");
    EXPECT_EQ(find_run_option("kv_cache.name")->get(c), "h2o-q8");
    const RunConfig j = run_config_from_json(R"({"kv_cache": {"name": "snapkv-torch-quantized4"}})", "test.json");
    EXPECT_EQ(j.kv_cache.name, "snapkv-q4");
    EXPECT_NE(run_config_to_json(j).find("\"snapkv-q4\""), std::string::npos);
    EXPECT_EQ(run_config_to_json(j).find("torch-quantized"), std::string::npos);
    const std::string msg = error_of([] {
        RunConfig r;
        set_run_option(r, "kv_cache.name", "h2o-q5");
    });
    EXPECT_NE(msg.find("unknown buffer 'q5'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kv::test
