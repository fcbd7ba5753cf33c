// The run-mode table: one entry per mode, the option table's choices and every consumer read it.
#include <gtest/gtest.h>

#include <set>

#include "engine/core/error.h"
#include "engine/core/run_mode.h"
#include "engine/run/run_config.h"
#include "engine/train/trainer.h"

namespace kv {
namespace {

TEST(RunModeTable, NamesAreUniqueAndFlagsFitTheirKind) {
    std::set<std::string> names;
    for (const RunModeInfo& m : run_mode_registry()) {
        EXPECT_TRUE(names.insert(m.name).second) << m.name;
        EXPECT_FALSE(m.summary.empty()) << m.name;
        if (m.kind != RunKind::TRAIN) {
            EXPECT_FALSE(m.lora) << m.name;
            EXPECT_FALSE(m.offload) << m.name;
        }
        // Fidelity needs a dense shadow of an evaluation; generation and training have none.
        if (m.supports_fidelity) {
            EXPECT_EQ(m.kind, RunKind::EVALUATE) << m.name;
        }
        EXPECT_EQ(find_run_mode(m.name), &m);
    }
    EXPECT_EQ(run_mode_registry().front().name, RunConfig{}.mode) << "the first mode is the default";
}

TEST(RunModeTable, TheOptionTableOffersExactlyTheRegisteredModes) {
    const OptionDef* o = find_run_option("mode");
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(run_modes(), run_mode_names());
}

TEST(RunModeTable, AnUnknownModeIsRefusedWithTheList) {
    EXPECT_EQ(find_run_mode("finetune"), nullptr);
    try {
        run_mode("finetune");
        FAIL() << "an unknown mode was accepted";
    } catch (const Error& e) {
        const std::string what = e.what();
        for (const std::string& n : run_mode_names()) EXPECT_NE(what.find(n), std::string::npos) << what;
    }
}

TEST(RunModeTable, TrainerClassifiesModesFromTheTable) {
    // Independent of the table: the modes' names say what they are (keys_values' naming).
    EXPECT_TRUE(is_lora_mode("finetune_long_lora"));
    EXPECT_TRUE(is_lora_mode("finetune_offload_lora"));
    EXPECT_FALSE(is_lora_mode("finetune_long_full"));
    EXPECT_TRUE(is_offload_mode("finetune_offload_full"));
    EXPECT_FALSE(is_offload_mode("finetune_long_lora"));
    EXPECT_FALSE(is_train_mode("eval_long"));
    EXPECT_FALSE(is_train_mode("generate"));
    EXPECT_FALSE(is_lora_mode("eval_lora"));  // not a mode at all
}

}  // namespace
}  // namespace kv
