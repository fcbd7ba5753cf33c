// The one cell -> layer -> chunk loop (see chunk_loop.h).
#include "chunk_loop.h"

#include <algorithm>
#include <optional>

#include "engine/core/error.h"
#include "engine/telemetry/trace.h"

namespace kv {

void run_chunk_loop(const Transformer& model, const ChunkPlan& plan, const ChunkLoopHooks& hooks, const ChunkLoopRange& range) {
    if (!hooks.inputs || !hooks.attention) throw Error("chunk loop: the inputs and attention hooks are required");
    const int l0 = range.layer_begin, l1 = range.layer_end < 0 ? int(model.config().num_layers) : range.layer_end;
    const size_t cell_end = std::min(range.cell_end, plan.cells.size());
    static const trace::Name kCell("cell"), kLayer("layer"), kChunk("chunk");
    for (size_t ci = range.cell_begin; ci < cell_end; ++ci) {
        const auto [c0, c1] = plan.cells[ci];
        // Optional spans: SpanScope is not movable, so each is built in place or not at all.
        std::optional<trace::SpanScope> cell_span;
        if (range.spans)
            cell_span.emplace(trace::SpanCategory::CELL, kCell, trace::SpanArgs{.cell_row = 0, .cell_col = int(ci)});
        std::vector<Tensor> xs = hooks.inputs(ci);
        if (xs.size() != c1 - c0)
            throw Error(str("chunk loop: cell ", ci, " got ", xs.size(), " inputs; expected one per chunk (", c1 - c0, ")"));
        for (int l = l0; l < l1; ++l) {
            if (hooks.before_layer) hooks.before_layer(l, ci, xs);
            std::optional<trace::SpanScope> layer_span;
            if (range.spans)
                layer_span.emplace(trace::SpanCategory::LAYER, kLayer, trace::SpanArgs{.layer = l, .cell_col = int(ci)});
            for (size_t c = c0; c < c1; ++c) {
                std::optional<trace::SpanScope> chunk_span;
                if (range.spans)
                    chunk_span.emplace(trace::SpanCategory::CHUNK, kChunk,
                                       trace::SpanArgs{.layer = l, .chunk = int(c), .cell_col = int(ci)});
                Tensor& x = xs[c - c0];
                if (hooks.before_chunk) hooks.before_chunk(l, c, x);
                BlockActivations* save = hooks.save ? hooks.save(l, c) : nullptr;
                x = model.block(l, x, plan.starts[c], hooks.attention(l, c), save);
                if (hooks.after_chunk) hooks.after_chunk(l, c, x);
            }
            layer_span.reset();
            if (hooks.after_layer) hooks.after_layer(l, ci);
        }
        if (hooks.after_cell) hooks.after_cell(ci, xs);
    }
}

}  // namespace kv
