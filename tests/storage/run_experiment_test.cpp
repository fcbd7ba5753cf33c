// storage/run_experiment.h: which configuration fields tell runs apart, their labels, and the
// mean and standard error of repeated runs (against the textbook formulas, computed here).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "storage/run_experiment.h"

namespace kv::storage {
namespace {

TEST(RunExperiment, FlatConfigReadsNestedAndFlatJsonAlike) {
    const FlatConfig nested = flat_run_config(R"({"data": {"name": "repeat", "seq_length": 1024}, "fidelity": true, "x": null})");
    EXPECT_EQ(nested.at("data.name"), "repeat");
    EXPECT_EQ(nested.at("data.seq_length"), "1024");
    EXPECT_EQ(nested.at("fidelity"), "true");
    EXPECT_EQ(nested.at("x"), "");
    const FlatConfig flat = flat_run_config(R"({"data.name": "repeat", "data.seq_length": 1024})");
    EXPECT_EQ(flat.at("data.name"), "repeat");
    EXPECT_EQ(flat.at("data.seq_length"), "1024");
    EXPECT_TRUE(flat_run_config("{not json").empty());
    EXPECT_TRUE(flat_run_config("[1, 2]").empty());
}

TEST(RunExperiment, DifferingFieldsLeaveOutAxesAndWhatIsOnlyRecorded) {
    const std::vector<FlatConfig> c = {
        flat_run_config(R"({"name": "a", "out_dir": "/x", "telemetry": {"cupti": true}, "kv_cache": {"name": "h2o-default", "cache_length": 256, "chunk_size": 64}, "data": {"seq_length": 1024}, "seed": 1})"),
        flat_run_config(R"({"name": "b", "out_dir": "/y", "telemetry": {"cupti": false}, "kv_cache": {"name": "tova-default", "cache_length": 512, "chunk_size": 64}, "data": {"seq_length": 2048}, "seed": 1})"),
        flat_run_config(R"({"name": "c", "kv_cache": {"name": "h2o-default", "cache_length": 256, "chunk_size": 32}, "data": {"seq_length": 1024}, "seed": 1, "precision": "bf16"})"),
    };
    EXPECT_EQ(differing_fields(c, {"kv_cache.name", "kv_cache.cache_length"}),
              (std::vector<std::string>{"data.seq_length", "kv_cache.chunk_size", "precision"}))
        << "name, out_dir and telemetry never split; a field one run lacks differs";
    EXPECT_EQ(differing_fields(c, {"kv_cache", "data"}), (std::vector<std::string>{"precision"})) << "an axis leaves out its subtree";
    EXPECT_EQ(differing_fields({c[0]}, {}), std::vector<std::string>{}) << "one run differs from nothing";
    // A dense reference that steps in the compared runs' chunks (prefill = their cache length)
    // is in their experiment when the cache length is an axis, and apart when it is not.
    const std::vector<FlatConfig> ref = {
        flat_run_config(R"({"kv_cache": {"name": "dense-default", "cache_length": 0, "prefill_length": 256}})"),
        flat_run_config(R"({"kv_cache": {"name": "h2o-default", "cache_length": 256, "prefill_length": 0}})"),
    };
    EXPECT_EQ(differing_fields(ref, {"kv_cache.name", "kv_cache.cache_length"}), std::vector<std::string>{});
    EXPECT_EQ(differing_fields(ref, {"kv_cache.name"}), (std::vector<std::string>{"kv_cache.cache_length", "kv_cache.prefill_length"}));
    EXPECT_FALSE(is_experiment_field("telemetry.score_interval"));
    EXPECT_FALSE(is_experiment_field("name"));
    EXPECT_TRUE(is_experiment_field("names")) << "a prefix of a word is not its subtree";
    EXPECT_TRUE(is_experiment_field("fidelity"));
    EXPECT_EQ(experiment_label(c[2], {"data.seq_length", "precision"}), "data.seq_length=1024, precision=bf16");
    EXPECT_EQ(experiment_label(c[0], {"precision"}), "precision=(unset)");
    EXPECT_EQ(experiment_label(c[0], {}), "");
}

TEST(RunExperiment, MeanAndStandardErrorAreTheTextbookOnes) {
    const MeanSe one = mean_and_se({3.5});
    EXPECT_EQ(one.n, 1);
    EXPECT_EQ(one.mean, 3.5);
    EXPECT_EQ(one.se, 0.0);
    // 1, 2, 3, 4: mean 2.5, sample variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, s.e. sqrt(5/3) / 2
    const MeanSe four = mean_and_se({4, 1, 3, 2});
    EXPECT_EQ(four.n, 4);
    EXPECT_DOUBLE_EQ(four.mean, 2.5);
    EXPECT_NEAR(four.se, std::sqrt(5.0 / 3.0) / 2.0, 1e-15);
    const MeanSe same = mean_and_se({0.25, 0.25, 0.25});
    EXPECT_EQ(same.se, 0.0) << "identical repeats carry no spread";
    EXPECT_EQ(mean_and_se({}).n, 0);
}

}  // namespace
}  // namespace kv::storage
