// Eviction map: which token positions each layer's KV cache holds after every chunk step —
// x = chunk step, y = token position — for one layer and KV head (cache row), or all layers as
// small multiples; coloured by presence, score or age; hover names the token, its slot, score and
// the steps it was inserted and evicted; wheel zooms, drag pans.
// Built only from the run's replay log (cache_steps rows, decoded by storage/cache_step_plan.h) and score
// snapshots; drawn as RGBA textures through TextureHost. Must not touch GL or engine objects.
//
// Index
//   [SECTION] data model (replay of cache steps, incremental)
//   [SECTION] images (binning, colour, texture pixels)
//   [SECTION] hit testing and hover details
//   [SECTION] view state, refresh, draw
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "storage/cache_step_plan.h"
#include "storage/rows.h"
#include "views/canvas.h"
#include "views/plot_util.h"
#include "views/token_text.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// =========================================================================================
// [SECTION] data model
// =========================================================================================
// A run's cache steps split into sequences: every pass-0 step with input_pos 0 starts a new
// sequence for its layer (an eval run caches each sample from scratch); step = chunk index
// inside the sequence. Replays of the gradient pipeline (pass > 0) repeat the same plans and
// are not drawn.
constexpr int32_t kStillCached = std::numeric_limits<int32_t>::max();

// One cache row (b * G + g; in eval B = 1, so the KV head) of one layer: the slot table after
// the newest step and, per token position, the step at which it left the cache.
struct EvictionTrack {
    std::vector<int32_t> slot_pos;    // (L) token position held by each slot, -1 = empty
    std::vector<int32_t> evicted_at;  // (tokens) step that evicted it; kStillCached while held
    std::vector<uint16_t> copies;     // (tokens) slots holding it now (grace-ring moves copy)
};

struct EvictionLayer {
    std::vector<SlotPlan> plans;         // (steps) the decoded replay log, plans[step]
    std::vector<int64_t> step_t_ns;      // (steps) engine time of each step
    int64_t slots = 0;                   // L: cache length (slots)
    int64_t rows = 1;                    // cache rows: 1 until a per-row plan (B * G rows) arrives
    int64_t tokens = 0;                  // token positions written so far (input_pos + n of the last step)
    std::vector<EvictionTrack> tracks;   // (rows)
    std::string error;                   // first malformed step (the rest of the layer is ignored)

    int steps() const { return int(plans.size()); }
    // Step whose chunk wrote token `pos` (-1 when not written yet).
    int inserted_step(int64_t pos) const;
};

struct EvictionSequence {
    std::vector<EvictionLayer> layers;  // by layer index (layers with no steps are empty)
    int steps() const;                  // widest layer
    int64_t tokens() const;             // longest layer
};

// Score snapshots of one layer, per sequence and step: (B, G, T) row-major values (empty when
// only the summary was recorded for that step).
struct EvictionLayerScores {
    struct Step {
        int32_t B = 0, G = 0, T = 0;
        std::vector<float> values;
    };
    std::vector<std::vector<Step>> sequences;  // [sequence][step]
    int64_t last_id = 0;                       // score_snapshots cursor for this layer
    int sequence_count = 0;                    // sequences started (chunk 0 seen)
    int32_t last_chunk = -1;
};

struct EvictionData {
    std::vector<EvictionSequence> sequences;
    std::vector<int> layer_sequences;  // per layer: sequences started (input_pos 0 steps seen)
    int64_t last_step_id = 0;          // newest cache step id ingested (any layer)
    std::vector<int64_t> layer_cursor;  // per layer: rows with id <= this are ingested
    int next_layer = 0;                 // where a budgeted refresh continues its pass over the layers
    int next_score_layer = 0;           // the same for every layer's scores (all layers, quest reads)
    uint64_t version = 0;              // bumped by every ingested step (images rebuild on change)
    std::map<int, EvictionLayerScores> scores;  // layers whose scores were requested
    uint64_t score_version = 0;

    int num_layers() const { return int(layer_sequences.size()); }
    // Applies one cache step (rows must arrive in id order). Returns false when ignored.
    bool ingest(const storage::CacheStepRow& row);
    // Records one score snapshot of its layer (id order per layer).
    void ingest_scores(const storage::ScoreRow& row);
    // Sequence index for "latest" (-1) or a clamped explicit index; -1 when there is none.
    int resolve_sequence(int sequence) const;
};


// =========================================================================================
// [SECTION] images
// =========================================================================================
// READS: Quest's selections — the score stream of a read policy holds, per slot and chunk, the
// share of the chunk's query rows (heads of the KV group x queries) that read the slot's page.
enum class EvictionColour : uint8_t { PRESENCE = 0, SCORE, AGE, READS, COUNT };
const char* eviction_colour_name(EvictionColour c);

// What to bin into one image. Binning rule (documented for the textures): one texel covers
// tokens_per_texel consecutive positions x steps_per_texel consecutive steps, each the smallest
// power of two with height <= max_height and width <= max_width; then tokens_per_texel doubles
// until width * height <= max_texels. With the default limits a run of up to 4096 steps gets
// width == steps, and up to 2048 positions one texel row per token.
struct EvictionImageSpec {
    int sequence = 0, layer = 0, row = 0;
    EvictionColour colour = EvictionColour::PRESENCE;
    int64_t token_lo = 0, token_hi = -1;  // [lo, hi) positions; hi < 0: all written so far
    int step_lo = 0, step_hi = -1;        // [lo, hi) steps; hi < 0: all so far
    int max_width = 4096, max_height = 2048;
    int64_t max_texels = int64_t(1) << 22;
    // Age/score colours span [range_lo, range_hi] instead of the image's own values, so maps
    // drawn side by side (compare) can share one colour bar.
    bool fixed_range = false;
    float range_lo = 0, range_hi = 1;
    bool operator==(const EvictionImageSpec&) const = default;
};

struct EvictionImage {
    EvictionImageSpec spec;
    int width = 0, height = 0;  // texels; column x = steps [step_lo + x*spt, ...), row y = tokens
    int64_t token_lo = 0, tokens_per_texel = 1;
    int step_lo = 0, steps_per_texel = 1;
    int64_t token_end = 0;  // exclusive end of the positions the image covers
    int step_end = 0;       // exclusive end of the steps it covers
    // (height, width) row-major. presence: fraction of the texel's (token, step) pairs held in
    // the cache after the step. value: presence -> the same fraction; age -> mean age in steps
    // of the held tokens; score -> mean score of held tokens with a known score. NaN = none.
    std::vector<float> presence, value;
    float value_min = 0, value_max = 0;  // range of finite values (what the colours span)
    std::vector<uint8_t> rgba;           // (height, width, 4) pixels for the texture
};

// Computes the image (values and pixels). `scores` is needed for SCORE (nullptr: NaN values).
EvictionImage build_eviction_image(const EvictionData& data, const EvictionImageSpec& spec);
// Colours an image's values into rgba (presence: intensity; age/score: colormap where held).
void colour_eviction_image(EvictionImage& img);
// What the colours of an image mean, for its colour bar: values [lo, hi] drawn with colour-map
// positions [t_lo, t_hi] (exactly what colour_eviction_image does); absent tokens are kNoDataColour.
struct EvictionColourKey {
    const char* title = "";
    double lo = 0, hi = 1;
    float t_lo = 0, t_hi = 1;
};
EvictionColourKey eviction_colour_key(const EvictionImage& img);
// Width of the colour bar with its "not cached" swatch, and drawing it into [p0, p1).
float eviction_colour_key_width(const EvictionColourKey& k);
void draw_eviction_colour_key(ImDrawList* dl, const EvictionColourKey& k, ImVec2 p0, ImVec2 p1);

// =========================================================================================
// [SECTION] hit testing and hover details
// =========================================================================================
struct EvictionHit {
    bool valid = false;
    int step = 0;
    int64_t token = 0;
};
// Maps a screen point inside `frame` to (step, token) for the visible ranges (x in steps,
// y in token positions, growing downwards). Invalid outside the frame or the data.
EvictionHit eviction_hit_test(const AxisRange& steps, const AxisRange& tokens, ImVec2 frame_p0, ImVec2 frame_p1,
                              ImVec2 point, int num_steps, int64_t num_tokens);

struct TokenAtStep {
    int64_t token = -1;
    int step = -1;
    bool cached = false;      // held after the step
    int slot = -1;            // a slot holding it after the step (-1 when not cached)
    int inserted_step = -1;   // step whose chunk wrote it
    int evicted_step = -1;    // step that evicted it (-1: never, so far)
    int age = -1;             // step - inserted_step while cached
    float score = std::numeric_limits<float>::quiet_NaN();  // slot score after the step, if recorded
};
// Replays the layer's row up to `step` (O(steps x chunk)) for the exact slot.
TokenAtStep eviction_token_info(const EvictionData& data, int sequence, int layer, int row, int64_t token, int step);
// Token position held by each slot of (sequence, layer, row) after `step` (-1 = empty); empty
// when the layer or step is unknown. Replays the layer's row (O(steps x chunk)).
std::vector<int32_t> eviction_slot_tokens(const EvictionData& data, int sequence, int layer, int row, int step);

// =========================================================================================
// [SECTION] view state, refresh, draw
// =========================================================================================
struct EvictionMapViewState {
    int64_t run = 0;
    // ---- selection (the host, tests and the compare view may set these) ----
    int sequence = -1;  // -1 = the newest sequence (sample) of the run
    int layer = 0;
    int head = 0;       // cache row (b * G + g); runs with shared slots have one row
    EvictionColour colour = EvictionColour::PRESENCE;
    bool all_layers = false;  // small multiples of every layer (presence, age or quest reads)
    bool toolbar = true;      // draw the selectors (the compare view draws one shared toolbar)
    bool colour_key = true;   // draw the colour bar (the compare view draws one for all maps)
    // Colour age/score over this range (compare: the union of every map's values); see
    // EvictionImageSpec::fixed_range.
    bool fixed_range = false;
    float range_lo = 0, range_hi = 1;
    AxisRange steps_range{0, 1}, tokens_range{0, 1};  // visible window (data units)
    bool follow = true;       // fit the window to the data as it grows (cleared by zoom/pan)
    // While the run is live: its tokens per sample (data.seq_length), so the fitted y axis
    // spans the whole sample from the first step instead of rescaling as positions arrive.
    // 0 once the run has ended (or when unknown): the axis fits the positions written.
    int64_t live_sample_tokens = 0;
    // ---- limits of the main image and of each small multiple ----
    int max_texture_width = 4096, max_texture_height = 2048;
    int64_t max_texels = int64_t(1) << 22;
    int small_width = 512, small_height = 256;
    double refresh_budget_ms = 20;  // refresh reads layer after layer until this is spent (one at least)
    double build_budget_ms = 12;  // all-layers mode builds textures until this is spent per frame (one at least)

    // ---- derived data (refresh fills; draw reads) ----
    EvictionData data;
    struct Texture {
        uint64_t id = 0;
        EvictionImage image;
        uint64_t version = 0, score_version = 0;
        bool valid = false;
    };
    Texture main;
    std::vector<Texture> layer_textures;  // all-layers mode
    bool hovered = false;  // `hover` describes the token under the mouse
    TokenAtStep hover;
    int hover_layer = -1;
    uint64_t hover_version = 0;
    std::string error;  // reading or decoding problem, shown in the view
    // Each layer's cache in words (the run summary's layer_kinds: views/layer_label.h), once known.
    std::vector<std::string> layer_kinds;
    // The run's token text (hover names the token) and the search box's marks.
    RunTokens tokens;
    TokenSearch search;
};

// Reads cache steps (and, in score mode, the shown layer's score snapshots) newer than what the
// state holds, one layer at a time (each layer's rows, replayed in id order) until the budget is
// spent; the next refresh continues the pass. Returns true when anything arrived.
bool refresh_eviction_map(EvictionMapViewState& s, storage::SessionReader& reader);
// Spec of the main image for the current selection and visible window (zoomed-in windows get
// finer texels once the current image is coarser than ~2 screen pixels per texel).
EvictionImageSpec eviction_main_spec(const EvictionMapViewState& s, float frame_height_px);
// Rebuilds and uploads the textures the current selection needs (if data or spec changed).
void update_eviction_textures(EvictionMapViewState& s, TextureHost* host, float frame_height_px);
void release_eviction_textures(EvictionMapViewState& s, TextureHost* host);
// The view body inside the current window: toolbar, map(s), hover tooltip. `size` 0 = fill.
void DrawEvictionMapView(EvictionMapViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry eviction_map_view_entry();

}  // namespace kv::views
