// The one cell -> layer -> chunk loop (reference §7.2). Every pass over a chunk plan runs through
// it: the long-context driver (the policy's forward), the gradient pipeline's replays (loss,
// checkpoints, a row's KV checkpoints, a cell's recorded forward) and fidelity's dense
// reference. Within a cell every chunk goes through layer l before any goes through l + 1, so a
// quantized buffer is (de)quantized once per (cell, layer) and the live activations stay at one
// cell. What differs between the passes is where a cell's inputs come from, which attention a
// chunk's block calls, and what happens around the blocks: the hooks below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "chunk_plan.h"
#include "engine/model/transformer.h"

namespace kv {

// Hooks of one pass. `inputs` and `attention` are required, the rest optional. Chunk indices
// are the plan's (within the sequence), cell indices the plan's cells.
struct ChunkLoopHooks {
    // The cell's inputs: one (B, n, E) tensor per chunk of the cell, in chunk order.
    std::function<std::vector<Tensor>(size_t cell)> inputs;
    // The attention chunk `chunk`'s block of `layer` calls; it must stay valid until that block
    // returns (the next call may replace it).
    std::function<LayerAttention&(int layer, size_t chunk)> attention;
    // Before a layer runs over the cell, with the cell's inputs to it (layer checkpoints).
    std::function<void(int layer, size_t cell, const std::vector<Tensor>& xs)> before_layer;
    // Before a chunk's block, with its input (cancellation, inputs kept for the backward).
    std::function<void(int layer, size_t chunk, const Tensor& x)> before_chunk;
    // Where the block keeps what its backward needs (BlockActivations), or null.
    std::function<BlockActivations*(int layer, size_t chunk)> save;
    // After a chunk's block, with its output (checks, context reconstruction, progress).
    std::function<void(int layer, size_t chunk, const Tensor& y)> after_chunk;
    // After every chunk of the cell went through the layer (progress in layer steps).
    std::function<void(int layer, size_t cell)> after_layer;
    // After the cell's last layer, with its outputs (heads, final checkpoints, KV snapshots).
    std::function<void(size_t cell, std::vector<Tensor>& xs)> after_cell;
};

// Which part of the lattice a pass covers, and whether it is traced.
struct ChunkLoopRange {
    size_t cell_begin = 0;
    size_t cell_end = std::numeric_limits<size_t>::max();  // clamped to the plan's cells
    int layer_begin = 0;
    int layer_end = -1;  // -1: the model's last layer + 1
    // Cell, layer and chunk spans (trace::span): the policy's forward has them (the cell-grid
    // and trace views draw them); replays inside the gradient pipeline do not.
    bool spans = false;
};

// Runs cells [cell_begin, cell_end) left to right; in each, layers [layer_begin, layer_end) in
// order, and in each layer the cell's chunks left to right:
//   xs = inputs(cell)
//   for layer: before_layer; for chunk: before_chunk; x = block(layer, x, start, attention,
//              save); after_chunk.  after_layer
//   after_cell(cell, xs)
void run_chunk_loop(const Transformer& model, const ChunkPlan& plan, const ChunkLoopHooks& hooks,
                    const ChunkLoopRange& range = {});

}  // namespace kv
