// Exploratory allocation variants of ada-* for the issue-19 experiments (tools/ada,
// kvlab_ada_budgets --ada.variant; docs/RESULTS.md "Every policy"). Not a run option: the
// product runs the paper's rule (PAPER). Process-wide, read when an ada-* policy is made.
#pragma once

#include <string>

namespace kv {

enum class AdaVariant {
    PAPER,  // every chunk: the layer's G n evictions by top-k over all heads (the default)
    EQUAL,  // every head evicts its own n lowest: budgets stay L (= the base scorer's allocation)
    FIXED,  // top-k over all heads at the first scored eviction only; then each head keeps its budget
    EMA,    // the paper's rule on scores averaged over chunks: s <- (s + new) / 2 per kept token
};

void set_ada_variant(AdaVariant v);
AdaVariant ada_variant();
// "paper", "equal", "fixed", "ema"; throws kv::Error naming the choices on anything else.
AdaVariant parse_ada_variant(const std::string& name);

}  // namespace kv
