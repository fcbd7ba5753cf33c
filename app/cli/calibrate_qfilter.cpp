// `kvlab calibrate qfilter MODEL --data FILE -o FILE`: the Q-Filters of a model from its own
// post-RoPE queries on a text (engine/kv/policies/qfilter_calibration.h); writes the filter file
// the `qfilter` policy reads (--kv_cache.qfilter). Nothing is downloaded.
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/data/text_windows.h"
#include "engine/kv/policies/qfilter_calibration.h"
#include "engine/model/model_loader.h"
#include "progress.h"

namespace kv::cli {

namespace {

std::vector<OptionSpec> qfilter_options() {
    std::vector<OptionSpec> o = {
        {"data", OptKind::STRING, "", "text file(s) the model reads (required; comma-separated)"},
        {"data.seq_length", OptKind::INT, "1024", "tokens per calibration window (one forward each, from position 0)"},
        {"samples", OptKind::INT, "4", "windows, from the start of the text"},
        {"output", OptKind::STRING, "", "the filter file to write (required; also -o PATH)"},
    };
    for (const OptionSpec& g : global_options()) o.push_back(g);
    return o;
}

void print_help() {
    std::printf("usage: kvlab calibrate qfilter MODEL --data FILE -o FILE [options]\n\n"
                "Q-Filters: the model reads the text without a cache; each KV head's filter is the main direction (top right\n"
                "singular vector) of its query heads' post-RoPE queries over every position, signed so that the mean query\n"
                "projects positively. The file is read by --kv_cache.name qfilter-default --kv_cache.qfilter FILE\n"
                "(docs/POLICIES.md#qfilter).\n\noptions:\n%s",
                format_options(qfilter_options()).c_str());
}

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    size_t a = 0;
    for (;;) {
        const size_t b = s.find(',', a);
        out.push_back(s.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) return out;
        a = b + 1;
    }
}

}  // namespace

int calibrate_qfilter(int argc, char** argv, int first) {
    std::vector<std::string> av_s(argv, argv + argc);
    for (size_t i = size_t(first); i < av_s.size(); ++i)
        if (av_s[i] == "-o") av_s[i] = "--output";
    std::vector<char*> av;
    for (auto& s : av_s) av.push_back(s.data());
    Args args(int(av.size()), av.data(), first, qfilter_options());
    if (args.flag("help")) {
        print_help();
        return 0;
    }
    apply_global_options(args);
    const auto& pos = args.positional();  // "qfilter" MODEL
    if (pos.size() < 2) throw UsageError("calibrate qfilter: missing MODEL; expected e.g. kvlab calibrate qfilter tiny --data text.txt -o tiny.qfilter");
    if (pos.size() > 2) throw UsageError(str("calibrate qfilter: unexpected argument '", pos[2], "'; expected one MODEL"));
    const std::string out = args.str("output");
    if (out.empty()) throw UsageError("calibrate qfilter: -o FILE is required (where to write the filters)");
    const std::string data = args.str("data");
    if (data.empty()) throw UsageError("calibrate qfilter: --data FILE is required (the text whose queries calibrate the filters)");
    const int64_t seq = args.integer("data.seq_length", 1024, 2, 1 << 20);
    const int64_t count = args.integer("samples", 4, 1, 100000);

    LoadedModel lm = load_model(pos[1], ModelOptions{});
    lm.model->set_context_width(seq);
    const TextWindows tw = make_text_windows(split_commas(data), *lm.tokenizer, seq, count);
    std::fprintf(stderr, "calibrate qfilter: %s, %lld layers x %lld KV heads of %lld, %zu windows of %lld tokens\n", lm.source.c_str(),
                 (long long)lm.config.num_layers, (long long)lm.config.num_kv_heads, (long long)lm.config.head_dim, tw.windows.size(),
                 (long long)seq);
    const auto t0 = std::chrono::steady_clock::now();
    Progress progress("calibrate qfilter", stderr, "windows");
    const QueryMoments m = collect_query_moments(*lm.model, tw.windows, [&](int64_t done, int64_t total) {
        progress.update(done, total, "post-RoPE queries folded into each head's second moments");
    });
    progress.finish();
    const auto t1 = std::chrono::steady_clock::now();
    QFilters f = qfilters_from_moments(m);
    f.model = pos[1];
    write_qfilters(out, f);
    const auto t2 = std::chrono::steady_clock::now();
    const double fwd = std::chrono::duration<double>(t1 - t0).count(), dir = std::chrono::duration<double>(t2 - t1).count();
    std::printf("wrote %s: %lld filters of %lld channels from %lld tokens (forward %.2f s, directions %.3f s)\n", out.c_str(),
                (long long)(f.layers * f.kv_heads), (long long)f.head_dim, (long long)f.tokens, fwd, dir);
    return 0;
}

}  // namespace kv::cli
