#include "engine/kv/calibration_registry.h"

#include "engine/kv/duo_calibration.h"
#include "engine/kv/kv_scales.h"
#include "engine/kv/kvzap_calibration.h"
#include "engine/kv/policies/qfilter_calibration.h"

namespace kv {

const std::vector<Calibration>& calibrations() {
    using K = CalibrationOption::Kind;
    static const std::vector<Calibration> table = {
        {"duo",
         "DuoAttention's calibration: every KV head's attention output becomes alpha * full + (1 - alpha) * streaming\n"
         "(sinks + recent window); the alphas are trained with Adam to keep the final hidden states close to the\n"
         "full-attention model's on synthetic retrieval samples, plus reg * mean(alpha). The file is read by\n"
         "--kv_cache.name duo-default --kv_cache.duo_gates FILE (docs/POLICIES.md#duo).",
         "steps",
         {"passkey", "recall", "needle"},
         1024,
         8,
         {{"steps", K::INT, 100, 1, 1000000, "optimisation steps"},
          {"lr", K::REAL, 0.02, 0.0, 100.0, "Adam learning rate of the gates (the paper's)"},
          {"reg", K::REAL, 0.05, 0.0, 1e6, "lambda of the L1 penalty on the gates (the paper's)"},
          {"sink", K::INT, 64, 0, 1 << 20, "attention sinks of the streaming mask"},
          {"recent", K::INT, 256, 1, 1 << 20, "recent window of the streaming mask"},
          {"supervised", K::INT, 32, 1, 1 << 20, "last positions of a sample whose final hidden states are compared"}},
         &run_duo_calibration},
        {"qfilter",
         "Q-Filters: the model reads the text without a cache; each KV head's filter is the main direction (top right\n"
         "singular vector) of its query heads' post-RoPE queries over every position, signed so that the mean query\n"
         "projects positively. The file is read by --kv_cache.name qfilter-default --kv_cache.qfilter FILE\n"
         "(docs/POLICIES.md#qfilter).",
         "windows",
         {},
         1024,
         4,
         {},
         &run_qfilter_calibration},
        {"kv-scales",
         "Per-head FP8 scales: max|K| / 448 and max|V| / 448 of every layer's KV heads (keys after RoPE) over forward\n"
         "passes of the text's windows. Read by --kv_cache.kv_scales FILE with fp8 buffers (fp8_e4m3, fp8_e5m2,\n"
         "kfp8vfp4): one fixed scale per head instead of a dynamic scale per row (docs/POLICIES.md).",
         "windows",
         {},
         2048,
         1,
         {},
         &run_kv_scales_calibration},
        {"kvzap",
         "KVzap's surrogate: the model reads the text's windows with a kvzip cache that keeps every token, so every\n"
         "token of every layer gets KVzip's score (the most attention a \"repeat the context\" pass pays it); per layer\n"
         "and KV head, a linear map from the token's hidden state (the layer's attention input) to log(max(score,\n"
         "floor)) is fitted by ridge least squares (normal equations in f64). Layer by layer, with FILE.resume after\n"
         "each: the same command continues after the last finished layer. The file is read by\n"
         "--kv_cache.name kvzap-default --kv_cache.kvzap FILE (docs/POLICIES.md#kvzap).",
         "steps",
         {},
         1024,
         8,
         {{"ridge", K::REAL, 1e-3, 0.0, 1e6, "ridge lambda as a fraction of the mean diagonal of X^T X (0: plain least squares)"},
          {"floor", K::REAL, 1e-10, 1e-300, 1.0, "smallest KVzip score before the log (scores below it are fitted as it)"}},
         &run_kvzap_calibration},
    };
    return table;
}

const Calibration* find_calibration(std::string_view name) {
    for (const Calibration& c : calibrations())
        if (name == c.name) return &c;
    return nullptr;
}

std::string calibration_names(const char* separator) {
    std::string s;
    for (const Calibration& c : calibrations()) s += (s.empty() ? "" : separator) + std::string(c.name);
    return s;
}

}  // namespace kv
