// `kvlab calibrate kv-scales MODEL --text FILE -o scales.txt`: per-head FP8 K/V scales
// (max|K| / 448 and max|V| / 448 of every layer's KV heads over one forward pass of the text;
// engine/kv/kv_scales.h), the file `--kv_cache.kv_scales` reads for fp8 buffers.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/kv/kv_scales.h"
#include "engine/model/model_loader.h"

namespace kv::cli {

namespace {

std::vector<OptionSpec> kv_scales_options() {
    std::vector<OptionSpec> o = {
        {"text", OptKind::STRING, "", "the calibration text (a UTF-8 file; required)"},
        {"max_tokens", OptKind::INT, "2048", "tokens of the text read (one forward pass from position 0)"},
        {"output", OptKind::STRING, "", "the scale file to write (required; also -o PATH)"},
    };
    for (const OptionSpec& g : global_options()) o.push_back(g);
    return o;
}

}  // namespace

int cmd_calibrate_kv_scales(int argc, char** argv, int first) {
    std::vector<std::string> av_s(argv, argv + argc);
    for (size_t i = size_t(first); i < av_s.size(); ++i)
        if (av_s[i] == "-o") av_s[i] = "--output";
    std::vector<char*> av;
    for (auto& s : av_s) av.push_back(s.data());
    Args args(int(av.size()), av.data(), first, kv_scales_options());
    if (args.flag("help")) {
        std::printf("usage: kvlab calibrate kv-scales MODEL --text FILE -o FILE [options]\n\n"
                    "Per-head FP8 scales: max|K| / 448 and max|V| / 448 of every layer's KV heads (keys after RoPE) over one\n"
                    "forward pass of the text. Read by --kv_cache.kv_scales FILE with fp8 buffers (fp8_e4m3, fp8_e5m2,\n"
                    "kfp8vfp4): one fixed scale per head instead of a dynamic scale per row.\n\noptions:\n%s",
                    format_options(kv_scales_options()).c_str());
        return 0;
    }
    apply_global_options(args);
    const auto& pos = args.positional();  // pos[0] is "kv-scales"
    if (pos.size() < 2) throw UsageError("calibrate kv-scales: missing MODEL; expected e.g. kvlab calibrate kv-scales tiny --text a.txt -o s.txt");
    if (pos.size() > 2) throw UsageError(str("calibrate kv-scales: unexpected argument '", pos[2], "'; expected one MODEL"));
    const std::string out = args.str("output"), text_path = args.str("text");
    if (out.empty()) throw UsageError("calibrate kv-scales: -o FILE is required (where to write the scales)");
    if (text_path.empty()) throw UsageError("calibrate kv-scales: --text FILE is required (the calibration text)");
    std::ifstream in(text_path, std::ios::binary);
    if (!in) throw UsageError(str("--text: '", text_path, "' cannot be read; expected a text file"));
    std::ostringstream ss;
    ss << in.rdbuf();
    const int64_t max_tokens = args.integer("max_tokens", 2048, 1, int64_t(1) << 24);

    LoadedModel lm = load_model(pos[1], ModelOptions{});
    std::vector<int32_t> ids = lm.tokenizer->encode(ss.str());
    if (int64_t(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
    if (ids.empty()) throw UsageError(str("--text: '", text_path, "' has no tokens; expected a non-empty text"));
    lm.model->set_context_width(int64_t(ids.size()));
    std::fprintf(stderr, "calibrate kv-scales: %s, %lld layers x %lld KV heads, %zu tokens of %s\n", lm.source.c_str(),
                 (long long)lm.config.num_layers, (long long)lm.config.num_kv_heads, ids.size(), text_path.c_str());
    const KvScales s = calibrate_kv_scales(*lm.model, ids);
    write_kv_scales(out, s);
    float kmax = 0, vmax = 0;
    for (float x : s.k) kmax = std::max(kmax, x);
    for (float x : s.v) vmax = std::max(vmax, x);
    std::printf("wrote %s: %lld x %lld per-head E4M3 scales; largest key scale %.6g (max|K| %.6g), value %.6g (max|V| %.6g)\n", out.c_str(),
                (long long)s.layers, (long long)s.kv_heads, double(kmax), double(kmax) * 448.0, double(vmax), double(vmax) * 448.0);
    return 0;
}

}  // namespace kv::cli
