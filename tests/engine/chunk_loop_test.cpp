// The one cell -> layer -> chunk loop (engine/driver/chunk_loop.h): it visits the plan in the
// documented order and calls each hook where the header says; its outputs equal blocks called by
// hand in another order (chunk by chunk through every layer), since each block sees the same
// inputs and the same stored K/V; passes over parts of the lattice (cell and layer ranges, as
// the gradient pipeline's rows and cells) compose to the whole pass bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/driver/chunk_loop.h"
#include "engine/ops/ops.h"
#include "tests/engine/tiny_model_util.h"

namespace kv::test {
namespace {

// Causal attention over every K/V the layer received so far (positions 0 .. input_pos + n),
// kept in (B, G, T, HS) tensors; logs each call as "attend l@pos".
class FullAttention final : public LayerAttention {
   public:
    FullAttention(const ModelConfig& c, int64_t B, int64_t T) : T_(T) {
        for (int l = 0; l < int(c.num_layers); ++l) {
            k_.push_back(Tensor::zeros({B, c.num_kv_heads, T, c.head_dim}, DType::F32));
            v_.push_back(Tensor::zeros({B, c.num_kv_heads, T, c.head_dim}, DType::F32));
        }
    }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        const int64_t n = q.size(2), end = input_pos + n;
        ASSERT_LE(end, T_);
        Tensor ks = k_[size_t(layer)].slice(2, input_pos, end), vs = v_[size_t(layer)].slice(2, input_pos, end);
        ops::copy_(ks, k);
        ops::copy_(vs, v);
        ops::sdpa_(y, q, k_[size_t(layer)].slice(2, 0, end), v_[size_t(layer)].slice(2, 0, end),
                   position_range(0, end, q.device()).unsqueeze(0), position_range(input_pos, n, q.device()), scale, window,
                   nullptr);
        log.push_back("attend " + std::to_string(layer) + "@" + std::to_string(input_pos));
    }
    std::vector<std::string> log;

   private:
    int64_t T_;
    std::vector<Tensor> k_, v_;
};

// Chunks 5, 3, 4, 4, 2 (18 tokens) in cells {0, 1}, {2, 3}, {4}.
ChunkPlan three_cells() {
    ChunkPlan p;
    p.chunks = {5, 3, 4, 4, 2};
    int64_t s = 0;
    for (int64_t n : p.chunks) p.starts.push_back(s), s += n;
    p.cells = {{0, 2}, {2, 4}, {4, 5}};
    return p;
}

Tensor ids_of(int64_t T) { return Tensor::from_i32({1, T}, random_tokens(T, 11)); }

std::vector<float> joined(const std::vector<Tensor>& chunks) {
    std::vector<float> out;
    for (const Tensor& t : chunks) {
        const std::vector<float> v = t.to_f32_vector();
        out.insert(out.end(), v.begin(), v.end());
    }
    return out;
}

// A pass with every hook logging, over the given range; the cell's inputs are the embeddings.
struct LoggedPass {
    std::vector<std::string> log;
    std::vector<Tensor> outputs;  // per chunk, after the range's last layer
};
LoggedPass logged_pass(const ChunkPlan& plan, const Tensor& ids, FullAttention& att, const ChunkLoopRange& range,
                       std::vector<Tensor>* start = nullptr) {
    const Transformer& m = tiny_model<7>().model;
    LoggedPass out;
    out.outputs.resize(plan.chunks.size());
    std::vector<BlockActivations> acts(plan.chunks.size());
    ChunkLoopHooks h;
    h.inputs = [&](size_t ci) {
        out.log.push_back("inputs " + std::to_string(ci));
        std::vector<Tensor> xs;
        for (size_t c = plan.cells[ci].first; c < plan.cells[ci].second; ++c)
            xs.push_back(start ? (*start)[c] : m.embed(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c])));
        return xs;
    };
    h.attention = [&](int, size_t) -> LayerAttention& { return att; };
    h.before_layer = [&](int l, size_t ci, const std::vector<Tensor>& xs) {
        out.log.push_back("before_layer " + std::to_string(l) + " " + std::to_string(ci) + " x" + std::to_string(xs.size()));
    };
    h.before_chunk = [&](int l, size_t c, const Tensor&) {
        out.log.push_back("before_chunk " + std::to_string(l) + " " + std::to_string(c));
    };
    h.save = [&](int, size_t c) { return &acts[c]; };
    h.after_chunk = [&](int l, size_t c, const Tensor&) {
        out.log.push_back("after_chunk " + std::to_string(l) + " " + std::to_string(c));
    };
    h.after_layer = [&](int l, size_t ci) { out.log.push_back("after_layer " + std::to_string(l) + " " + std::to_string(ci)); };
    h.after_cell = [&](size_t ci, std::vector<Tensor>& xs) {
        out.log.push_back("after_cell " + std::to_string(ci));
        for (size_t c = plan.cells[ci].first; c < plan.cells[ci].second; ++c) out.outputs[c] = xs[c - plan.cells[ci].first];
    };
    run_chunk_loop(m, plan, h, range);
    return out;
}

TEST(ChunkLoop, VisitsCellsThenLayersThenChunksWithEachHookInPlace) {
    const ChunkPlan plan = three_cells();
    const Tensor ids = ids_of(18);
    const ModelConfig& cfg = tiny_model<7>().cfg;
    FullAttention att(cfg, 1, 18);
    const LoggedPass got = logged_pass(plan, ids, att, {});
    // The order chunk_loop.h documents, written out from the plan.
    std::vector<std::string> want, want_attend;
    for (size_t ci = 0; ci < plan.cells.size(); ++ci) {
        const auto [c0, c1] = plan.cells[ci];
        want.push_back("inputs " + std::to_string(ci));
        for (int l = 0; l < int(cfg.num_layers); ++l) {
            want.push_back("before_layer " + std::to_string(l) + " " + std::to_string(ci) + " x" + std::to_string(c1 - c0));
            for (size_t c = c0; c < c1; ++c) {
                want.push_back("before_chunk " + std::to_string(l) + " " + std::to_string(c));
                want.push_back("after_chunk " + std::to_string(l) + " " + std::to_string(c));
                want_attend.push_back("attend " + std::to_string(l) + "@" + std::to_string(plan.starts[c]));
            }
            want.push_back("after_layer " + std::to_string(l) + " " + std::to_string(ci));
        }
        want.push_back("after_cell " + std::to_string(ci));
    }
    EXPECT_EQ(got.log, want);
    EXPECT_EQ(att.log, want_attend);
}

TEST(ChunkLoop, OutputsEqualBlocksCalledChunkByChunk) {
    const ChunkPlan plan = three_cells();
    const Tensor ids = ids_of(18);
    const Transformer& m = tiny_model<7>().model;
    FullAttention att(m.config(), 1, 18), ref_att(m.config(), 1, 18);
    const LoggedPass got = logged_pass(plan, ids, att, {});
    // By hand, in the other order: each chunk through every layer before the next chunk.
    std::vector<Tensor> ref;
    for (size_t c = 0; c < plan.chunks.size(); ++c) {
        Tensor x = m.embed(ids.slice(1, plan.starts[c], plan.starts[c] + plan.chunks[c]));
        for (int l = 0; l < int(m.config().num_layers); ++l) x = m.block(l, x, plan.starts[c], ref_att);
        ref.push_back(x);
    }
    EXPECT_EQ(joined(got.outputs), joined(ref));
}

TEST(ChunkLoop, RangesOfCellsAndLayersComposeToTheWholePass) {
    const ChunkPlan plan = three_cells();
    const Tensor ids = ids_of(18);
    const Transformer& m = tiny_model<7>().model;
    const int nl = int(m.config().num_layers);
    ASSERT_GE(nl, 2);
    FullAttention whole_att(m.config(), 1, 18);
    const LoggedPass whole = logged_pass(plan, ids, whole_att, {});

    // Cells: [0, 1) then [1, end) on the same attention.
    FullAttention cells_att(m.config(), 1, 18);
    LoggedPass a = logged_pass(plan, ids, cells_att, {.cell_end = 1});
    const LoggedPass b = logged_pass(plan, ids, cells_att, {.cell_begin = 1});
    for (size_t c = plan.cells[0].second; c < plan.chunks.size(); ++c) a.outputs[c] = b.outputs[c];
    EXPECT_EQ(joined(a.outputs), joined(whole.outputs));
    EXPECT_EQ(a.log.front(), "inputs 0");
    EXPECT_EQ(a.log.back(), "after_cell 0");
    EXPECT_EQ(b.log.front(), "inputs 1");

    // Layers: [0, 1) over every cell, then [1, nl) from its outputs (a row of the gradient pipeline).
    FullAttention rows_att(m.config(), 1, 18);
    LoggedPass low = logged_pass(plan, ids, rows_att, {.layer_begin = 0, .layer_end = 1});
    const LoggedPass high = logged_pass(plan, ids, rows_att, {.layer_begin = 1, .layer_end = nl}, &low.outputs);
    EXPECT_EQ(joined(high.outputs), joined(whole.outputs));
    for (const std::string& e : high.log) EXPECT_EQ(e.rfind("before_layer 0 ", 0), std::string::npos) << e;
}

TEST(ChunkLoop, RefusesInputsThatDoNotMatchTheCell) {
    const ChunkPlan plan = three_cells();
    const Transformer& m = tiny_model<7>().model;
    FullAttention att(m.config(), 1, 18);
    ChunkLoopHooks h;
    h.inputs = [&](size_t) { return std::vector<Tensor>{}; };
    h.attention = [&](int, size_t) -> LayerAttention& { return att; };
    try {
        run_chunk_loop(m, plan, h);
        FAIL() << "a cell without inputs ran";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cell 0 got 0 inputs; expected one per chunk (2)"), std::string::npos) << e.what();
    }
    ChunkLoopHooks none;
    EXPECT_THROW(run_chunk_loop(m, plan, none), Error);
}

}  // namespace
}  // namespace kv::test
