// kvlab_ada_budgets: how an evicting policy's per-head budgets evolve over a run (issue 19,
// docs/POLICIES.md#ada-kv). Runs one evaluation like `kvlab eval_long` and, after every chunk
// of every layer once the cache is full, counts per KV head the slots it keeps, the slots older
// than the chunk (the past its queries can see) and whether it still keeps the first token.
//
//   kvlab_ada_budgets smollm2-135m --data text --data.files F --data.seq_length 4096
//       --kv_cache.name ada-snapkv --kv_cache.cache_length 512 --kv_cache.chunk_size 128
//
// Prints the run's perplexity / copy accuracy and one line of budget statistics: head budgets
// (min / mean / max in units of L), how often a head sat at the safeguard floor, held no old
// token, or had lost the first token, and whether every layer's budgets summed to G L.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"
#include "engine/run/run_config.h"

using namespace kv;

int main(int argc, char** argv) {
    try {
        if (argc < 2 || (argc - 2) % 2 != 0)
            throw Error("usage: kvlab_ada_budgets MODEL [--run.option value ...]", "options come in pairs, as kvlab eval_long's");
        RunConfig cfg;
        cfg.mode = "eval_long";
        cfg.model = argv[1];
        cfg.telemetry.enabled = false;
        for (int i = 2; i < argc; i += 2) {
            std::string k = argv[i];
            if (k.rfind("--", 0) != 0) throw Error(str("'", k, "' is not an option; expected --name value"));
            set_run_option(cfg, k.substr(2), argv[i + 1]);
        }
        auto problems = run_config_problems(cfg);
        if (!problems.empty()) throw Error(problems.front());
        ModelOptions mo;
        LoadedModel lm = load_model(cfg.model, mo, cfg.model_seed);

        const double alpha = cfg.kv_cache.policy_options.count("ada_alpha") ? cfg.kv_cache.policy_options.at("ada_alpha") : 0.2;
        int64_t steps = 0, head_steps = 0, at_floor = 0, no_old = 0, no_sink = 0, bad_sum = 0, L = 0;
        double bmin = 1e300, bmax = 0, bsum = 0;
        std::map<int, std::pair<int64_t, int64_t>> floor_by_layer;  // layer -> (at floor, head steps)
        EvalCallbacks cb;
        cb.on_layer_step = [&](const LayerStep& s) {
            const KVPolicy& p = *s.policy;
            L = p.cache_length();
            const int64_t B = p.batch(), G = p.groups(), S = p.pool_slots() > 0 ? p.pool_slots() : L;
            if (!p.per_row_positions() || s.chunk == 0) return;
            const std::vector<int32_t>& pos = p.token_positions();
            const int64_t P = s.plan->input_pos, n = s.plan->n;
            // Only chunks that evicted (the cache was full before them).
            if (P < L) return;
            ++steps;
            const int64_t floor = std::max<int64_t>(int64_t(std::floor(alpha * double(L))), n);
            for (int64_t b = 0; b < B; ++b) {
                int64_t total = 0;
                for (int64_t g = 0; g < G; ++g) {
                    const int32_t* r = pos.data() + (b * G + g) * S;
                    int64_t c = 0, old = 0;
                    bool sink = false;
                    for (int64_t j = 0; j < S; ++j) {
                        if (r[j] < 0) continue;
                        ++c;
                        old += r[j] < P;
                        sink = sink || r[j] == 0;
                    }
                    total += c;
                    ++head_steps;
                    const double f = double(c) / double(L);
                    bmin = std::min(bmin, f), bmax = std::max(bmax, f), bsum += f;
                    at_floor += c <= floor;
                    no_old += old == 0;
                    no_sink += !sink;
                    auto& fl = floor_by_layer[s.layer];
                    fl.first += c <= floor, ++fl.second;
                }
                bad_sum += total != G * L;
            }
        };
        EvalSummary sum = run_eval(cfg, lm, cb);
        std::printf("%s L=%lld n=%lld alpha=%.2f: ", cfg.kv_cache.name.c_str(), (long long)L, (long long)cfg.driver.chunk_size, alpha);
        if (sum.perplexity > 0) std::printf("perplexity %.3f", sum.perplexity);
        if (sum.copy_token_accuracy >= 0) std::printf("copy %.3f", sum.copy_token_accuracy);
        std::printf(" | %lld (layer, chunk) steps after full; head budget / L min %.3f mean %.3f max %.3f; at the floor %.1f%%; "
                    "no slot older than the chunk %.1f%%; first token lost %.1f%%; layers whose budgets != G L: %lld\n",
                    (long long)steps, head_steps ? bmin : 0.0, head_steps ? bsum / double(head_steps) : 0.0, bmax,
                    head_steps ? 100.0 * double(at_floor) / double(head_steps) : 0.0,
                    head_steps ? 100.0 * double(no_old) / double(head_steps) : 0.0,
                    head_steps ? 100.0 * double(no_sink) / double(head_steps) : 0.0, (long long)bad_sum);
        std::printf("  at the floor by layer (%%):");
        for (const auto& [l, fl] : floor_by_layer) std::printf(" %d:%.0f", l, 100.0 * double(fl.first) / double(std::max<int64_t>(1, fl.second)));
        std::printf("\n");
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvlab_ada_budgets: %s\n", e.what());
        return 1;
    }
}
