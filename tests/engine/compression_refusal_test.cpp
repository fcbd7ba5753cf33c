// compression_refusal (the check `kvlab sweep --kv_cache.name all` makes before anything runs):
// for every registered policy, it refuses exactly the policies whose compress-then-ask run on
// `tiny` fails, and its reason is that run's message.
#include <gtest/gtest.h>

#include "engine/core/cache_name.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/model_loader.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/evaluate.h"

namespace kv {
namespace {

TEST(CompressionRefusal, RefusesExactlyThePoliciesWhoseRunFails) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    int accepted = 0, refused = 0;
    for (const std::string& policy : kv_policy_names()) {
        SCOPED_TRACE(policy);
        RunConfig cfg;
        cfg.mode = "eval_long";
        cfg.model = "tiny";
        cfg.data.name = "niah_single";
        cfg.data.seq_length = 512;
        cfg.data.num_samples = 1;
        cfg.driver.chunk_size = 32;
        cfg.protocol.name = "compress-then-ask";
        cfg.protocol.compression_ratio = 0.5;
        std::string run_error;
        try {
            set_run_option(cfg, "kv_cache.name", CacheName{policy, "default"}.text());
        } catch (const Error& e) {
            run_error = e.what();  // a buffer the policy cannot use: refused by the name itself
        }
        if (!run_error.empty()) continue;
        const std::string why = compression_refusal(cfg, lm);
        try {
            run_eval(cfg, lm);
        } catch (const Error& e) {
            run_error = e.what();
        }
        EXPECT_EQ(why.empty(), run_error.empty()) << "probe: '" << why << "', run: '" << run_error << "'";
        if (!why.empty() && !run_error.empty()) {
            // The same kind of refusal: the probe's first line is the run's (a trial on a
            // shorter context may quote other numbers after it).
            EXPECT_EQ(why.substr(0, why.find(':')), run_error.substr(0, run_error.find(':')));
        }
        (why.empty() ? accepted : refused) += 1;
    }
    EXPECT_GT(accepted, 10);
    EXPECT_GT(refused, 3);
}

}  // namespace
}  // namespace kv
