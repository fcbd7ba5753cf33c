// `kvlab bench families`: the forward of each architecture family kvlab reads (Gemma 2 with
// soft-capping, Gemma 3 and 3n, SmolLM3, Phi-3, OLMo 2, gpt-oss, DeepSeek-V2, LFM2) against a
// Llama of the same active parameter count (the preset's shapes, its MLP width moved to match
// when the family's count differs), timed interleaved in one run (target: every family within
// 1.2x of that Llama's time); against the preset's own shapes too where the two Llamas differ.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cache_bench.h"

namespace kv::bench {

struct FamilyBenchOptions {
    std::string model = "small";  // the Llama preset whose shapes every family takes
    int64_t tokens = 512;         // one prefill of this many tokens per measurement
    int repeats = 3;              // interleaved rounds; the best time of each counts
    std::vector<std::string> families;  // the families measured (empty: all); the Llama always runs
};
// The families run_family_bench knows, in table order.
const std::vector<std::string>& family_names();
// Per family a row with a = its prefill tokens/s, b = the matched Llama's, ratio a / b (target
// >= 1 / 1.2), and where that Llama is not the preset's, a row against the preset (no target).
std::vector<CacheBenchRow> run_family_bench(const FamilyBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

}  // namespace kv::bench
