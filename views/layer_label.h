// Layer labels that name each layer's type (issue 40): "layer 3" for a layer that keeps
// everything, "layer 0 (window 512)", "layer 5 (shared with layer 3)", "layer 2 (convolution)",
// read from the run summary's layer_kinds (engine/core/layer_kind.h); a run without them (still
// running, or recorded before they existed) gets the plain labels.
#pragma once

#include <string>
#include <vector>

namespace kv::views {

// The summary's "layer_kinds" (a JSON object text; empty or malformed: none).
std::vector<std::string> layer_kinds_of_summary(const std::string& summary_json);
// " (KIND)", or "" for a plain full-attention layer (and for an unknown one).
std::string layer_kind_suffix(int layer, const std::vector<std::string>& kinds);
// "layer L" + layer_kind_suffix.
std::string layer_label(int layer, const std::vector<std::string>& kinds);

}  // namespace kv::views
