// kvlab_ada_budgets: how an evicting policy's per-head budgets evolve over a run (issue 19,
// docs/POLICIES.md#ada-kv). Runs one evaluation like `kvlab eval_long` and, after every chunk
// of every layer once the cache is full, counts per KV head the slots it keeps, the slots older
// than the chunk (the past its queries can see) and whether it still keeps the first token.
//
//   kvlab_ada_budgets smollm2-135m --data text --data.files F --data.seq_length 4096
//       --kv_cache.name ada-snapkv --kv_cache.cache_length 512 --kv_cache.chunk_size 128
//
// Prints the run's perplexity / copy accuracy and one line of budget statistics: head budgets
// (min / mean / max in units of L), how often a head sat at the safeguard floor (at most
// floor(alpha L) slots older than the chunk), held no old token, or had lost the first token,
// and whether every layer's budgets summed to G L. Works for any per-head policy (snapkv: S = L).
//   --ada.variant V   an exploratory allocation of ada-* (engine/kv/policies/policy_ada.h): paper (the
//                     default), equal, fixed, ema
//   --ada.stats FILE  per (layer, head) score statistics of batch row 0 (the header line names
//                     the columns): are the heads' scores comparable?
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_ada.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"
#include "engine/run/run_config.h"

using namespace kv;

int main(int argc, char** argv) {
    try {
        if (argc < 2 || (argc - 2) % 2 != 0)
            throw Error("usage: kvlab_ada_budgets MODEL [--ada.variant paper|equal|fixed|ema] [--ada.stats FILE] [--run.option value ...]",
                        "options come in pairs, as kvlab eval_long's");
        RunConfig cfg;
        cfg.mode = "eval_long";
        cfg.model = argv[1];
        cfg.telemetry.enabled = false;
        std::string stats_file;
        for (int i = 2; i < argc; i += 2) {
            std::string k = argv[i];
            if (k.rfind("--", 0) != 0) throw Error(str("'", k, "' is not an option; expected --name value"));
            if (k == "--ada.variant") set_ada_variant(parse_ada_variant(argv[i + 1]));
            else if (k == "--ada.stats") stats_file = argv[i + 1];
            else set_run_option(cfg, k.substr(2), argv[i + 1]);
        }
        auto problems = run_config_problems(cfg);
        if (!problems.empty()) throw Error(problems.front());
        ModelOptions mo;
        LoadedModel lm = load_model(cfg.model, mo, cfg.model_seed);

        const double alpha = cfg.kv_cache.policy_options.count("ada_alpha") ? cfg.kv_cache.policy_options.at("ada_alpha") : 0.2;
        int64_t steps = 0, head_steps = 0, at_floor = 0, no_old = 0, no_sink = 0, bad_sum = 0, L = 0;
        double bmin = 1e300, bmax = 0, bsum = 0;
        std::map<int, std::pair<int64_t, int64_t>> floor_by_layer;  // layer -> (at floor, head steps)
        // Per (layer, head), summed over the steps after full (batch row 0): budget / L, the
        // head's score mass, the mean score of its slots older than the chunk and of the chunk's
        // own tokens, the share of the mass on the older slots, the first token kept, and the
        // slots it lost to the next chunk's evictions (hypothesis (b): comparable scores?).
        struct HeadStat {
            int64_t steps = 0, sink = 0, evicted = 0, prev = -1;
            double budget = 0, mass = 0, old_mean = 0, new_mean = 0, old_share = 0;
        };
        std::map<std::pair<int, int64_t>, HeadStat> hs;
        int64_t n_chunk = 0;
        EvalCallbacks cb;
        cb.on_layer_step = [&](const LayerStep& s) {
            const KVPolicy& p = *s.policy;
            L = p.cache_length();
            const int64_t B = p.batch(), G = p.groups(), S = pool_slots(p) > 0 ? pool_slots(p) : L;
            if (!p.per_row_positions() || s.chunk == 0) return;
            const std::vector<int32_t>& pos = p.token_positions();
            const int64_t P = s.plan->input_pos, n = s.plan->n;
            // Only chunks that evicted (the cache was full before them).
            if (P < L) return;
            ++steps;
            // The safeguard's floor: floor(alpha L) slots older than the chunk (its n new tokens
            // come on top; docs/POLICIES.md#ada-kv).
            const int64_t floor = int64_t(std::floor(alpha * double(L)));
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
                    at_floor += old <= floor;
                    no_old += old == 0;
                    no_sink += !sink;
                    auto& fl = floor_by_layer[s.layer];
                    fl.first += old <= floor, ++fl.second;
                }
                bad_sum += total != G * L;
            }
            if (stats_file.empty()) return;
            n_chunk = n;
            const std::vector<float> sc = p.slot_scores();
            if (sc.empty()) return;
            for (int64_t g = 0; g < G; ++g) {
                const int32_t* r = pos.data() + g * S;
                const float* x = sc.data() + g * S;
                double mass = 0, om = 0, nm = 0;
                int64_t c = 0, oc = 0, nc = 0;
                bool sink = false;
                for (int64_t j = 0; j < S; ++j) {
                    if (r[j] < 0) continue;
                    ++c, mass += x[j], sink = sink || r[j] == 0;
                    if (r[j] < P) om += x[j], ++oc;
                    else nm += x[j], ++nc;
                }
                HeadStat& h = hs[{s.layer, g}];
                ++h.steps, h.sink += sink;
                h.budget += double(c) / double(L), h.mass += mass;
                h.old_mean += oc ? om / double(oc) : 0.0, h.new_mean += nc ? nm / double(nc) : 0.0;
                h.old_share += mass > 0 ? om / mass : 0.0;
                if (h.prev >= 0) h.evicted += h.prev + n - c;
                h.prev = c;
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
        if (!stats_file.empty()) {
            FILE* fo = std::fopen(stats_file.c_str(), "w");
            if (!fo) throw Error(str("cannot write --ada.stats file '", stats_file, "'"));
            std::fprintf(fo, "layer head steps budget/L mass old_mean new_mean old_mean/new_mean old_share first_kept evicted/step/n\n");
            for (const auto& [k, h] : hs) {
                const double d = double(std::max<int64_t>(1, h.steps));
                std::fprintf(fo, "%d %lld %lld %.3f %.3f %.3e %.3e %.3f %.3f %.3f %.3f\n", k.first, (long long)k.second, (long long)h.steps,
                             h.budget / d, h.mass / d, h.old_mean / d, h.new_mean / d, h.new_mean > 0 ? h.old_mean / h.new_mean : 0.0,
                             h.old_share / d, double(h.sink) / d, double(h.evicted) / std::max(1.0, d - 1) / double(std::max<int64_t>(1, n_chunk)));
            }
            std::fclose(fo);
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvlab_ada_budgets: %s\n", e.what());
        return 1;
    }
}
