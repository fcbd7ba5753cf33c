// `kvlab calibrate duo MODEL [--data passkey] [--steps N] ... -o gates.txt`: DuoAttention's
// gate calibration (engine/kv/duo_calibration.h) on synthetic retrieval samples, with a
// progress bar; writes the gate file the `duo` policy reads (--kv_cache.duo_gates).
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/kv/policies/duo_gates.h"
#include "engine/model/model_loader.h"
#include "engine/data/synthetic_samples.h"
#include "engine/kv/duo_calibration.h"
#include "progress.h"

namespace kv::cli {

int calibrate_qfilter(int argc, char** argv, int first);  // calibrate_qfilter.cpp

namespace {

std::vector<OptionSpec> calibrate_options() {
    std::vector<OptionSpec> o = {
        {"data", OptKind::STRING, "passkey", "synthetic retrieval task: passkey, recall or needle"},
        {"data.seq_length", OptKind::INT, "1024", "tokens per calibration sample"},
        {"samples", OptKind::INT, "8", "distinct samples (one per step, cycling)"},
        {"steps", OptKind::INT, "100", "optimisation steps"},
        {"lr", OptKind::FLOAT, "0.02", "Adam learning rate of the gates (the paper's)"},
        {"reg", OptKind::FLOAT, "0.05", "lambda of the L1 penalty on the gates (the paper's)"},
        {"sink", OptKind::INT, "64", "attention sinks of the streaming mask"},
        {"recent", OptKind::INT, "256", "recent window of the streaming mask"},
        {"supervised", OptKind::INT, "32", "last positions of a sample whose final hidden states are compared"},
        {"seed", OptKind::INT, "1234", "seed of the synthetic samples"},
        {"output", OptKind::STRING, "", "the gate file to write (required; also -o PATH)"},
    };
    for (const OptionSpec& g : global_options()) o.push_back(g);
    return o;
}

void print_help() {
    std::printf("usage: kvlab calibrate duo MODEL -o FILE [options]\n\n"
                "DuoAttention's calibration: every KV head's attention output becomes alpha * full + (1 - alpha) * streaming\n"
                "(sinks + recent window); the alphas are trained with Adam to keep the final hidden states close to the\n"
                "full-attention model's on synthetic retrieval samples, plus reg * mean(alpha). The file is read by\n"
                "--kv_cache.name duo-default --kv_cache.duo_gates FILE (docs/POLICIES.md#duo).\n\noptions:\n%s",
                format_options(calibrate_options()).c_str());
}

}  // namespace

int cmd_calibrate(int argc, char** argv, int first) {
    // Other calibrations have their own file and options (calibrate_<what>.cpp).
    if (argc > first && std::string(argv[first]) == "qfilter") return calibrate_qfilter(argc, argv, first);
    // "-o PATH" is the conventional spelling; the option parser only knows "--name".
    std::vector<std::string> av_s(argv, argv + argc);
    for (size_t i = size_t(first); i < av_s.size(); ++i)
        if (av_s[i] == "-o") av_s[i] = "--output";
    std::vector<char*> av;
    for (auto& s : av_s) av.push_back(s.data());
    Args args(int(av.size()), av.data(), first, calibrate_options());
    if (args.flag("help")) {
        print_help();
        return 0;
    }
    apply_global_options(args);
    const auto& pos = args.positional();
    if (pos.empty() || pos[0] != "duo")
        throw UsageError(str("calibrate: ", pos.empty() ? std::string("missing what to calibrate") : "unknown '" + pos[0] + "'",
                             "; expected: kvlab calibrate duo MODEL -o FILE or kvlab calibrate qfilter MODEL --data FILE -o FILE"));
    if (pos.size() < 2) throw UsageError("calibrate duo: missing MODEL; expected e.g. kvlab calibrate duo tiny -o gates.txt");
    if (pos.size() > 2) throw UsageError(str("calibrate duo: unexpected argument '", pos[2], "'; expected one MODEL"));
    const std::string out = args.str("output");
    if (out.empty()) throw UsageError("calibrate duo: -o FILE is required (where to write the gates)");
    const std::string task = args.str("data", "passkey");
    if (task != "passkey" && task != "recall" && task != "needle")
        throw UsageError(str("--data: '", task, "' is not a calibration task; expected passkey, recall or needle"));
    DuoCalibrationConfig cfg;
    const int64_t seq = args.integer("data.seq_length", 1024, 16, 1 << 20);
    const int64_t count = args.integer("samples", 8, 1, 100000);
    cfg.steps = args.integer("steps", 100, 1, 1000000);
    cfg.lr = args.real("lr", 0.02, 0.0, 100.0);
    cfg.reg = args.real("reg", 0.05, 0.0, 1e6);
    cfg.sink = args.integer("sink", 64, 0, 1 << 20);
    cfg.recent = args.integer("recent", 256, 1, 1 << 20);
    cfg.supervised = args.integer("supervised", 32, 1, 1 << 20);
    const uint64_t seed = uint64_t(args.integer("seed", 1234, 0, (1LL << 62)));

    LoadedModel lm = load_model(pos[1], ModelOptions{});
    lm.model->set_context_width(seq);
    std::fprintf(stderr, "calibrate duo: %s, %lld layers x %lld KV heads, %lld %s samples of %lld tokens, %lld steps\n",
                 lm.source.c_str(), (long long)lm.config.num_layers, (long long)lm.config.num_kv_heads, (long long)count,
                 task.c_str(), (long long)seq, (long long)cfg.steps);
    const auto samples = synthetic_samples(task, seq, count, seed, *lm.tokenizer);
    Progress progress("calibrate duo", stderr, "steps");
    const std::vector<double> alpha = calibrate_duo(*lm.model, samples, cfg, [&](const DuoCalibrationStep& s) {
        progress.update(s.step, s.steps, str("loss ", s.loss, " (hidden-state distance ", s.distance, ")"));
    });
    progress.finish();

    DuoGates g;
    g.model = pos[1];
    g.layers = lm.config.num_layers;
    g.kv_heads = lm.config.num_kv_heads;
    g.sink = cfg.sink;
    g.recent = cfg.recent;
    g.gates = alpha;
    write_duo_gates(out, g);
    // The ranking, highest gate first: what the sparsity option cuts.
    std::vector<size_t> order(alpha.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return alpha[a] > alpha[b]; });
    std::printf("wrote %s: %zu gates; highest first:", out.c_str(), alpha.size());
    for (size_t i = 0; i < std::min<size_t>(order.size(), 8); ++i)
        std::printf(" L%zu.H%zu=%.3f", order[i] / size_t(g.kv_heads), order[i] % size_t(g.kv_heads), alpha[order[i]]);
    std::printf("\n");
    return 0;
}

}  // namespace kv::cli
