// Cell grid: the long-context schedule as layers (rows) x chunks (columns), tiled into the
// cells the driver walks (cell -> layer -> chunk); each (layer, chunk) coloured by how long it
// took once done, the newest one marked, cells outlined; hover gives the chunk's time and the
// cell's time and peak memory. Live: refresh reads only spans and cells newer than its cursors.
// Sources: CHUNK and CELL spans (every run) and the cells table (gradient pipeline).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "storage/run_info.h"
#include "views/canvas.h"
#include "views/plot_util.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

struct GridChunk {  // one (layer, chunk) of a sequence
    int64_t start_ns = 0, end_ns = 0;
    bool done = false;
    int32_t cell_col = -1;
};

struct GridCell {
    int32_t row = -1, col = -1;
    int32_t layer_begin = 0, layer_end = 0, chunk_begin = 0, chunk_end = 0;  // [begin, end)
    int64_t start_ns = 0, end_ns = 0;
    bool finished = false;
    int64_t peak_bytes = -1;  // cells table, or the memory events inside the cell (-1: unknown yet)
    bool from_table = false;
    int32_t device = -1;
};

// One sequence (sample) of the run: a new one starts with the (layer 0, chunk 0) span.
struct GridSequence {
    int layers = 0, chunks = 0;
    std::vector<std::vector<GridChunk>> rows;  // [layer][chunk], each row grown as chunks appear
    std::vector<GridCell> cells;
    int done = 0;
    int last_layer = -1, last_chunk = -1;  // newest finished (layer, chunk)
    int64_t start_ns = 0;
    GridChunk& at(int layer, int chunk);  // grows the grid
    const GridChunk* find(int layer, int chunk) const;
};

struct GridHit {
    bool valid = false;
    int layer = -1, chunk = -1;
    int cell = -1;  // index into GridSequence::cells, -1 none
};
// Maps a point in the grid rectangle (layers top to bottom, chunks left to right) to (layer, chunk, cell).
GridHit cell_grid_hit_test(const GridSequence& g, ImVec2 p0, ImVec2 p1, ImVec2 point);

// The grid as an image: one texel per (layer, chunk), binned by max_width columns; colour =
// chunk time on the colour map (log scale between the fastest and slowest done chunk), pending
// chunks dark.
struct GridImage {
    int width = 0, height = 0, chunks_per_texel = 1;
    double time_lo_ns = 0, time_hi_ns = 0;  // fastest and slowest done chunk (the colour bar's ends)
    std::vector<uint8_t> rgba;
};
GridImage build_cell_grid_image(const GridSequence& g, int max_width = 2048);

struct CellGridViewState {
    int64_t run = 0;
    int sequence = -1;   // -1: newest
    int chunks_total = 0;  // expected chunks per sequence (0: as seen); the host may set it
    // ---- derived data ----
    std::vector<GridSequence> sequences;
    int64_t last_span_id = 0, last_cell_id = 0;
    size_t rows_per_read = 8192;
    double refresh_budget_ms = 20;  // reading stops after this long per refresh (resumes next time)
    int64_t t0_ns = 0;
    storage::RunProgress progress;
    std::vector<std::string> layer_kinds;  // each layer's cache in words (run summary; views/layer_label.h)
    std::map<int, int64_t> last_device_total;  // device total after the newest event scanned for a cell peak
    // Finished cells whose peak is being read from their events, a slice per refresh.
    struct PendingPeak {
        size_t sequence = 0, cell = 0;
        int64_t t_from = 0;   // next slice starts here (ties re-read: harmless for a maximum)
        int64_t peak = -1;
        bool started = false;
    };
    std::vector<PendingPeak> pending_peaks;
    uint64_t version = 0;
    uint64_t texture_id = 0;
    GridImage image;
    uint64_t image_version = 0;
    int image_sequence = -2;
    std::string error;
    int resolve_sequence() const;
};

bool refresh_cell_grid(CellGridViewState& s, storage::SessionReader& reader);
void release_cell_grid_textures(CellGridViewState& s, TextureHost* host);
void DrawCellGridView(CellGridViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry cell_grid_view_entry();

}  // namespace kv::views
