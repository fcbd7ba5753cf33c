// Scores: the newest eviction scores of every layer's slots as a heatmap (one row per layer, or
// per layer and KV head; slots by index or sorted), plus a histogram of one layer's scores and
// the recorded summary statistics. Follows a live run: refresh reads only newer snapshot
// summaries and then the one full array per layer that changed. Reads storage rows only.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "storage/rows.h"  // the record vocabulary: MemCategory, trace event types
#include "views/canvas.h"
#include "views/colormap.h"
#include "views/eviction_map.h"
#include "views/plot_util.h"
#include "views/token_text.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// The newest snapshot with a full score array of one layer.
struct LayerScores {
    int64_t id = 0;  // score_snapshots row id (0: none yet)
    int32_t chunk = -1;
    int64_t t_ns = 0;
    int32_t B = 0, G = 0, T = 0;
    trace::ScoreStats stats;
    std::vector<float> values;  // (B, G, T) row-major; +inf marks slots never evicted (grace ring)
};

struct ScoreHistogram {
    double lo = 0, hi = 0;         // range of the finite values; bin i covers lo + i * width
    std::vector<int64_t> counts;   // (bins)
    int64_t nonfinite = 0;         // +-inf / NaN values (protected slots), not binned
    int64_t total() const;         // binned + nonfinite == values given
};
// Histogram of `values` into `bins` equal bins over their finite range (max in the last bin).
ScoreHistogram score_histogram(const float* values, size_t n, int bins);

// Heatmap image: row r = (layer, head) pairs in layer order (one head, or all B*G rows of each
// layer), column = slot (or rank when sorted, highest score first); binned by averaging when a
// layer has more slots than max_width. Values normalized per layer (or shared) to [0, 1].
struct ScoresImage {
    int width = 0, height = 0;
    int slots_per_texel = 1;
    std::vector<int> row_layer, row_head;  // (height) what each texel row shows
    std::vector<float> norm;               // (height, width) normalized value, NaN = no value, +inf = protected
    std::vector<float> raw;                // (height, width) mean raw score of the texel
    std::vector<uint8_t> rgba;
};
// Normalized value -> colour (monotone in the value: the shared colour map); NaN -> background,
// +inf -> the "protected" colour.
Colour score_colour(float normalized);
struct ScoresImageOptions {
    int head = -1;              // -1: all heads of each layer
    bool sorted = false;        // columns by descending score instead of by slot
    bool shared_scale = false;  // one range for all layers
    // Colour by the score's rank within its row (0 = lowest, 1 = highest) instead of its value:
    // one attention-sink slot scoring 100x the rest no longer leaves the row dark.
    bool rank = false;
    int max_width = 2048;
};
// Layers whose top score dwarfs the rest (max > 20 x the 99th percentile, from the recorded
// summary): on a linear colour scale their other slots all look dark.
std::vector<int> score_outlier_layers(const std::vector<LayerScores>& layers);
ScoresImage build_scores_image(const std::vector<LayerScores>& layers, const ScoresImageOptions& o);

struct ScoresHit {
    bool valid = false;
    int layer = -1, head = -1;
    int slot_lo = 0, slot_hi = 0;  // slots (or ranks when sorted) under the texel
    float score = 0;
};
ScoresHit scores_hit_test(const ScoresImage& img, bool sorted, ImVec2 p0, ImVec2 p1, ImVec2 point);

struct ScoresViewState {
    int64_t run = 0;
    // ---- options (host/tests may set) ----
    ScoresImageOptions image_options;
    int histogram_layer = 0;
    int histogram_bins = 48;
    // ---- derived data ----
    std::vector<LayerScores> layers;  // index = layer
    int64_t last_id = 0;              // summaries cursor
    std::vector<int64_t> newest_with_values;  // per layer: newest row id holding a full array
    std::vector<trace::ScoreStats> newest_stats;  // per layer: newest summary (any row)
    uint64_t version = 0;
    uint64_t texture_id = 0;
    ScoresImage image;
    uint64_t image_version = 0;
    ScoresImageOptions image_built_with;
    bool image_valid = false;
    std::string error;
    // ---- token text: which token each slot holds at its snapshot's chunk ----
    // The run's samples (ids, pieces) and the search box. Slots map to positions through the
    // cache steps' replay, read only once the view is hovered or searched (want_positions).
    RunTokens tokens;
    TokenSearch search;
    bool want_positions = false, positions_loaded = false;
    EvictionData positions;
    std::vector<int64_t> positions_cursor;  // per layer: cache_steps id read up to
    struct SlotTokens {
        int layer = -1, head = -1, chunk = -1;
        uint64_t version = 0;
        std::vector<int32_t> pos;  // (slots) token position held, -1 = empty
    };
    std::vector<SlotTokens> slot_tokens;  // cache, one per (layer, head) asked for
};

bool refresh_scores(ScoresViewState& s, storage::SessionReader& reader);
// The draw wants the slot -> token mapping that refresh has not read yet.
bool scores_has_requests(const ScoresViewState& s);
// Serves them: reads the cache steps that map slots to tokens. True when it read (repaint).
bool serve_scores_requests(ScoresViewState& s, storage::SessionReader& reader);
// Token position held by each slot of `layer`'s `head` at the chunk of its shown snapshot (the
// newest sample), replayed from the cache steps; nullptr when not loaded or unknown.
const std::vector<int32_t>* scores_slot_tokens(ScoresViewState& s, int layer, int head);
void release_scores_textures(ScoresViewState& s, TextureHost* host);
void DrawScoresView(ScoresViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry scores_view_entry();

}  // namespace kv::views
