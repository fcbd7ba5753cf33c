// KVzap calibration (docs/POLICIES.md#kvzap): the model reads each text window with a `kvzip`
// cache large enough to keep every token, so every token of every layer gets KVzip's score
// (the most softmax weight any query of the "repeat the context" pieces pays it,
// engine/kv/context_reconstruction.h, policies/policy_kvzip.cpp) beside the hidden state its
// layer's q/k/v projections read (the attention input after its norm). Per layer, a linear map
// per KV head from that hidden state to log(max(score, floor)) is fitted by ridge least squares
// in closed form: the normal equations, summed in f64 in token order, solved by Cholesky. The
// rows are the `kvzap` policy's surrogate (policies/kvzap_weights.h).
//
// The windows go through the model layer by layer (every window's layer l, then its fit, then
// layer l + 1), so a layer's fit is final once its windows are through. After each layer the
// finished rows and every window's hidden states (of the text and of its reconstruction pieces)
// are written to FILE.resume; a rerun of the same command (same model, text windows and options)
// continues after the last finished layer and removes FILE.resume when it writes FILE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv/calibration_registry.h"

namespace kv {

// The normal equations of one layer: X^T X and X^T Y over the tokens seen, X's rows [h ; 1]
// (E + 1 values), Y's rows the G targets of the token.
struct KVzapNormalEquations {
    int64_t E = 0, G = 0, tokens = 0;
    std::vector<double> xtx;  // (E + 1, E + 1), upper triangle summed (the lower is mirrored by the solve)
    std::vector<double> xty;  // (E + 1, G)
    std::vector<double> yy;   // (G) sum of squared targets (the fit's error, informational)
    KVzapNormalEquations(int64_t E_, int64_t G_);
    // n tokens: h (n, E) and y (n, G) row-major.
    void add(const std::vector<double>& h, const std::vector<double>& y, int64_t n);
};

// Each head's [w ; b] (G rows of E + 1) minimising sum_t (w . h_t + b - y_tg)^2 + lambda |w|^2,
// lambda = ridge * (mean of the E diagonal entries of X^T X for the weights); the bias is not
// penalised. Throws when the system is singular (too few distinct tokens for ridge 0).
std::vector<double> solve_kvzap_layer(const KVzapNormalEquations& ne, double ridge);

// `kvlab calibrate kvzap`: the surrogate of run.model from KVzip's scores on the run's text
// windows (options ridge, floor), written to run.output with progress per (layer, window);
// resumes from run.output + ".resume" when it matches. Returns the rows written, the tokens,
// the mean squared error of the fit on its own tokens and the time.
std::string run_kvzap_calibration(const CalibrationRun& run);

}  // namespace kv
