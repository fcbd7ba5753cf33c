// Chunk and cell planning (see chunk_plan.h and reference §7.1).
#include "chunk_plan.h"

#include <algorithm>
#include <random>

#include "engine/core/error.h"

namespace kv {

int64_t ChunkPlan::max_chunk() const {
    int64_t m = 0;
    for (size_t i = 1; i < chunks.size(); ++i) m = std::max(m, chunks[i]);
    return m;
}

std::vector<std::pair<size_t, size_t>> group_cells(const std::vector<int64_t>& chunks, int64_t max_cell_len) {
    std::vector<std::pair<size_t, size_t>> cells;
    size_t begin = 0;
    int64_t len = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
        if (i > begin && len + chunks[i] > max_cell_len) {
            cells.push_back({begin, i});
            begin = i;
            len = 0;
        }
        len += chunks[i];
        if (len > max_cell_len) {  // a single over-long chunk (the prefill) stands alone
            cells.push_back({begin, i + 1});
            begin = i + 1;
            len = 0;
        }
    }
    if (begin < chunks.size()) cells.push_back({begin, chunks.size()});
    return cells;
}

ChunkPlan plan_chunks(int64_t seq, const std::vector<int64_t>& cache_lengths, const ChunkPlanOptions& opt) {
    if (seq < 1) throw Error(str("sequence length must be >= 1, got ", seq));
    if (opt.chunk_size < 1) throw Error(str("--kv_cache.chunk_size: ", opt.chunk_size, " must be >= 1"));
    std::vector<int64_t> Ls;
    for (int64_t L : cache_lengths) Ls.push_back(L > 0 ? L : seq);
    if (Ls.empty()) Ls.push_back(seq);
    const int64_t mpl = *std::min_element(Ls.begin(), Ls.end());  // max prefill length
    std::vector<int64_t> pts;                                     // distinct L <= seq, ascending
    for (int64_t L : Ls)
        if (L <= seq) pts.push_back(L);
    std::sort(pts.begin(), pts.end());
    pts.erase(std::unique(pts.begin(), pts.end()), pts.end());

    if (opt.prefill < 0) throw Error(str("--kv_cache.prefill_length: ", opt.prefill, " must be >= 0"));
    const int64_t prefill = opt.prefill > 0 ? std::min({opt.prefill, mpl, seq}) : mpl;
    ChunkPlan p;
    if (pts.empty()) {
        p.chunks = seq <= prefill ? std::vector<int64_t>{seq} : std::vector<int64_t>{prefill, seq - prefill};
    } else {
        int64_t done = prefill;
        p.chunks.push_back(prefill);
        while (!pts.empty() && pts.front() <= done) pts.erase(pts.begin());
        // Randomized sizes: five draws in [cs - cs/2, cs + cs/2] (capped at the first cache
        // length), each chunk picks one of them.
        std::vector<int64_t> choices;
        std::mt19937_64 rng(opt.seed);
        if (opt.randomize) {
            const int64_t cs = opt.chunk_size;
            const int64_t lo = std::max<int64_t>(cs - cs / 2, 1), hi = std::max(lo, std::min<int64_t>(cs + cs / 2, mpl));
            std::uniform_int_distribution<int64_t> u(lo, hi);
            for (int i = 0; i < 5; ++i) choices.push_back(u(rng));
        }
        while (done < seq) {
            int64_t c = opt.chunk_size;
            if (opt.randomize) c = choices[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng)];
            // No chunk longer than the smallest cache: a full layer of that length could not
            // take it (with per-layer lengths the chunk size can exceed the shortest layer).
            c = std::min({c, mpl, seq - done});
            if (!pts.empty() && done + c >= pts.front() - kChunkSnapTokens) {
                c = pts.front() - done;
                pts.erase(pts.begin());
            }
            if (c > 0) p.chunks.push_back(c);
            done += c;
        }
    }
    int64_t s = 0;
    for (int64_t c : p.chunks) {
        p.starts.push_back(s);
        s += c;
    }
    const double mult = std::max(0.1, opt.chunks_per_cell_multiplier);
    const int64_t max_cell = std::max<int64_t>(1, int64_t(opt.cell_factor * double(*std::max_element(Ls.begin(), Ls.end())) * mult));
    p.cells = group_cells(p.chunks, max_cell);
    return p;
}

}  // namespace kv
