// Calibrated FP8 K/V scales (vLLM's calibrated kv-cache scales, per KV head): `kvlab calibrate
// kv-scales` runs the model over a text, takes max|K| and max|V| of every layer's KV heads
// (keys after RoPE, as the cache stores them) and writes s = max / 448, the E4M3 scale that
// maps the largest value seen to E4M3's largest finite value. `--kv_cache.kv_scales FILE` then
// gives fp8 buffers one fixed scale per head instead of a dynamic scale per row (values past
// the calibrated range saturate). The file:
//
//   kvlab kv-scales 1
//   model <name>
//   layers <L> kv_heads <G> head_dim <D>
//   <layer> <head> <k_scale> <v_scale>      (L * G lines, scales as %.9g, E4M3's max 448)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/kv/calibration_registry.h"

namespace kv {

struct KvScales {
    std::string model;
    int64_t layers = 0, kv_heads = 0, head_dim = 0;
    std::vector<float> k, v;  // (layers, kv_heads): E4M3 scales, max / 448
    float k_scale(int64_t layer, int64_t g) const { return k[size_t(layer * kv_heads + g)]; }
    float v_scale(int64_t layer, int64_t g) const { return v[size_t(layer * kv_heads + g)]; }
};

// Throws kv::Error naming the file and what was wrong (missing, not a kv-scales file, a bad line).
KvScales read_kv_scales(const std::string& path);
void write_kv_scales(const std::string& path, const KvScales& s);
// The scales must describe this cache's model: throws kv::Error naming both shapes otherwise.
void check_kv_scales(const KvScales& s, const std::string& path, int64_t layers, int64_t kv_heads, int64_t head_dim);

// max|K| / 448 and max|V| / 448 per layer and KV head over one forward pass of ids (one chunk
// from position 0, attention over the whole sequence).
KvScales calibrate_kv_scales(const Transformer& model, const std::vector<int32_t>& ids);
// The same over several windows (each its own pass from position 0): the maxima over all of them.
KvScales calibrate_kv_scales(const Transformer& model, const std::vector<std::vector<int32_t>>& windows,
                             const std::function<void(int64_t, int64_t)>& progress = {});

// `kvlab calibrate kv-scales`: the scales over every window of the run's text (the maximum over
// windows, each one forward pass from position 0), written to run.output.
std::string run_kv_scales_calibration(const CalibrationRun& run);

}  // namespace kv
