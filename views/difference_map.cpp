// Difference map (see difference_map.h).
#include "views/difference_map.h"

#include <algorithm>

namespace kv::views {

std::vector<HeldSteps> held_steps(const EvictionLayer& ly, int row) {
    std::vector<HeldSteps> out(size_t(std::max<int64_t>(0, ly.tokens)));
    if (ly.tracks.empty()) return out;
    const EvictionTrack& tr = ly.tracks[size_t(std::clamp(row, 0, int(ly.tracks.size()) - 1))];
    const int steps = ly.steps();
    for (int k = 0; k < steps; ++k) {
        const SlotPlan& p = ly.plans[size_t(k)];
        for (int64_t t = p.input_pos; t < p.input_pos + p.n && t < ly.tokens; ++t) {
            const int32_t ev = size_t(t) < tr.evicted_at.size() ? tr.evicted_at[size_t(t)] : kStillCached;
            out[size_t(t)] = {k, ev == kStillCached ? steps : ev};
        }
    }
    return out;
}

namespace {
const EvictionLayer* layer_of(const EvictionData& d, int seq, int layer) {
    if (seq < 0 || size_t(seq) >= d.sequences.size() || layer < 0) return nullptr;
    const auto& layers = d.sequences[size_t(seq)].layers;
    return size_t(layer) < layers.size() && layers[size_t(layer)].steps() > 0 ? &layers[size_t(layer)] : nullptr;
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

DifferenceImage build_difference_image(const EvictionData& a, int seq_a, const EvictionData& b, int seq_b, int layer, int row,
                                       int max_width, int max_height) {
    DifferenceImage img;
    const EvictionLayer* la = layer_of(a, seq_a, layer);
    const EvictionLayer* lb = layer_of(b, seq_b, layer);
    if (!la || !lb) {
        img.error = "layer " + std::to_string(layer) + " has no cache steps in " + (la ? "run B" : "run A") + " yet";
        return img;
    }
    if (la->steps() != lb->steps() || la->tokens != lb->tokens) {
        img.error = "the runs cut the sample differently (A: " + std::to_string(la->steps()) + " steps over " +
                    std::to_string(la->tokens) + " positions, B: " + std::to_string(lb->steps()) + " over " +
                    std::to_string(lb->tokens) + "); a difference map needs the same data and chunk sizes";
        return img;
    }
    img.steps = la->steps();
    img.tokens = la->tokens;
    while (ceil_div(img.tokens, img.tokens_per_texel) > std::max(1, max_height)) img.tokens_per_texel *= 2;
    while (ceil_div(img.steps, img.steps_per_texel) > std::max(1, max_width)) img.steps_per_texel *= 2;
    img.width = int(ceil_div(img.steps, img.steps_per_texel));
    img.height = int(ceil_div(img.tokens, img.tokens_per_texel));
    const std::vector<HeldSteps> ha = held_steps(*la, row), hb = held_steps(*lb, row);
    img.rgba.assign(size_t(img.width) * size_t(img.height) * 4, 0);
    // Per texel row: difference arrays over steps (+1 where a held span starts, -1 where it
    // ends) for A, B and their overlap, summed into per-step counts, then into columns.
    const size_t S = size_t(img.steps);
    std::vector<int64_t> da(S + 1), db(S + 1), dboth(S + 1);
    auto add = [](std::vector<int64_t>& d, int32_t from, int32_t to) {
        if (from < to) ++d[size_t(from)], --d[size_t(to)];
    };
    for (int y = 0; y < img.height; ++y) {
        std::fill(da.begin(), da.end(), 0), std::fill(db.begin(), db.end(), 0), std::fill(dboth.begin(), dboth.end(), 0);
        const int64_t p0 = int64_t(y) * img.tokens_per_texel, p1 = std::min(img.tokens, p0 + img.tokens_per_texel);
        for (int64_t p = p0; p < p1; ++p) {
            const HeldSteps A = ha[size_t(p)], B = hb[size_t(p)];
            add(da, A.from, A.to);
            add(db, B.from, B.to);
            add(dboth, std::max(A.from, B.from), std::min(A.to, B.to));
        }
        int64_t na = 0, nb = 0, nboth = 0;
        for (int x = 0; x < img.width; ++x) {
            int64_t both = 0, only_a = 0, only_b = 0;
            const int s0 = x * img.steps_per_texel, s1 = std::min(img.steps, s0 + img.steps_per_texel);
            for (int s = s0; s < s1; ++s) {
                na += da[size_t(s)], nb += db[size_t(s)], nboth += dboth[size_t(s)];
                both += nboth, only_a += na - nboth, only_b += nb - nboth;
            }
            img.counts.both += both, img.counts.only_a += only_a, img.counts.only_b += only_b;
            // Mix the classes' colours by their share of the texel over the "neither" background.
            const double area = double(p1 - p0) * double(s1 - s0);
            const double w[4] = {double(both) / area, double(only_a) / area, double(only_b) / area,
                                 1.0 - double(both + only_a + only_b) / area};
            const Colour c[4] = {kDiffBothColour, kDiffOnlyAColour, kDiffOnlyBColour, kNoDataColour};
            uint8_t* px = img.rgba.data() + (size_t(y) * size_t(img.width) + size_t(x)) * 4;
            double r = 0, g = 0, bl = 0;
            for (int k = 0; k < 4; ++k) r += w[k] * colour_r(c[k]), g += w[k] * colour_g(c[k]), bl += w[k] * colour_b(c[k]);
            px[0] = uint8_t(std::clamp(r + 0.5, 0.0, 255.0)), px[1] = uint8_t(std::clamp(g + 0.5, 0.0, 255.0));
            px[2] = uint8_t(std::clamp(bl + 0.5, 0.0, 255.0)), px[3] = 255;
        }
    }
    return img;
}

}  // namespace kv::views
