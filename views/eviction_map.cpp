// Eviction map (see eviction_map.h).
//
// Index
//   [SECTION] data model
//   [SECTION] images
//   [SECTION] hit testing and hover details
//   [SECTION] refresh and textures
//   [SECTION] drawing
#include "views/view_table.h"
#include "views/eviction_map.h"
#include "views/layer_label.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "storage/config_fields.h"
#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// A blob claiming more slots than this is corrupt, not a cache (keeps a bad row from
// allocating gigabytes).
constexpr int64_t kMaxSlots = int64_t(1) << 26;
constexpr int64_t kMaxTokens = int64_t(1) << 30;
}  // namespace

// =========================================================================================
// [SECTION] data model
// =========================================================================================
int EvictionLayer::inserted_step(int64_t pos) const {
    // plans are in input_pos order: the last step starting at or before pos.
    auto it = std::upper_bound(plans.begin(), plans.end(), pos,
                               [](int64_t p, const SlotPlan& s) { return p < s.input_pos; });
    if (it == plans.begin()) return -1;
    --it;
    return pos < it->input_pos + it->n ? int(it - plans.begin()) : -1;
}

int EvictionSequence::steps() const {
    int s = 0;
    for (const auto& l : layers) s = std::max(s, l.steps());
    return s;
}

int64_t EvictionSequence::tokens() const {
    int64_t t = 0;
    for (const auto& l : layers) t = std::max(t, l.tokens);
    return t;
}

namespace {

// Checks that a decoded plan indexes inside sane bounds; returns the slots it needs.
int64_t plan_slots_needed(const SlotPlan& p, std::string& why) {
    if (int64_t(p.targets.size()) != p.rows * p.n || int64_t(p.move_from.size()) != p.rows * p.moves ||
        int64_t(p.move_to.size()) != p.rows * p.moves) {
        why = "plan arrays do not match its sizes";
        return -1;
    }
    if (p.input_pos < 0 || p.input_pos + p.n > kMaxTokens) {
        why = "token positions out of range";
        return -1;
    }
    int64_t need = 0;
    for (const auto* v : {&p.targets, &p.move_from, &p.move_to})
        for (int32_t s : *v) {
            if (s < 0 || s >= kMaxSlots) {
                why = "slot " + std::to_string(s) + " out of range";
                return -1;
            }
            need = std::max<int64_t>(need, int64_t(s) + 1);
        }
    return need;
}

// One step on one track through the one replay (replay_plan_row), counting copies so a token
// counts as evicted only when no slot holds it any more (the grace ring copies a token before
// its old slot is reused).
void track_apply(EvictionTrack& tr, const SlotPlan& p, int64_t row, int step, std::vector<int32_t>& touched) {
    touched.clear();
    replay_plan_row(p, row, tr.slot_pos.data(), int64_t(tr.slot_pos.size()), [&](const SlotWrite& w) {
        if (w.old_pos >= 0) {
            --tr.copies[size_t(w.old_pos)];
            touched.push_back(w.old_pos);
        }
        if (w.new_pos >= 0) ++tr.copies[size_t(w.new_pos)];
        if (!w.moved) tr.evicted_at[size_t(w.new_pos)] = kStillCached;
    });
    for (int32_t old : touched)
        if (tr.copies[size_t(old)] == 0 && tr.evicted_at[size_t(old)] == kStillCached) tr.evicted_at[size_t(old)] = step;
}

}  // namespace

bool EvictionData::ingest(const storage::CacheStepRow& row) {
    last_step_id = std::max(last_step_id, row.id);
    if (row.pass != 0 || row.layer < 0 || row.layer > 4096) return false;
    const size_t li = size_t(row.layer);
    if (layer_sequences.size() <= li) layer_sequences.resize(li + 1, 0);
    SlotPlan p;
    std::string why;
    storage::decode_cache_step(row, p, why);
    const bool starts = why.empty() && p.input_pos == 0;
    if (starts || layer_sequences[li] == 0) ++layer_sequences[li];
    const size_t seq = size_t(layer_sequences[li] - 1);
    if (sequences.size() <= seq) sequences.resize(seq + 1);
    auto& layers = sequences[seq].layers;
    if (layers.size() <= li) layers.resize(li + 1);
    EvictionLayer& ly = layers[li];
    if (!ly.error.empty()) return false;
    const int64_t need = why.empty() ? plan_slots_needed(p, why) : -1;
    if (why.empty() && ly.rows > 1 && p.rows != 1 && p.rows != ly.rows) why = "cache row count changed mid-sequence";
    if (!why.empty()) {
        ly.error = "layer " + std::to_string(row.layer) + " step " + std::to_string(row.chunk) + ": " + why +
                   "; later steps of this layer are not shown";
        ++version;
        return false;
    }
    ly.slots = std::max({ly.slots, int64_t(row.cache_length), need});
    if (ly.tracks.empty()) ly.tracks.resize(1);
    if (p.rows > ly.rows) {  // slots were shared until now: every row starts from row 0's state
        ly.tracks.resize(size_t(p.rows), ly.tracks[0]);
        ly.rows = p.rows;
    }
    const int64_t end = p.input_pos + p.n;
    std::vector<int32_t> touched;
    const int step = ly.steps();
    for (int64_t r = 0; r < ly.rows; ++r) {
        EvictionTrack& tr = ly.tracks[size_t(r)];
        if (int64_t(tr.slot_pos.size()) < ly.slots) tr.slot_pos.resize(size_t(ly.slots), -1);
        if (int64_t(tr.evicted_at.size()) < end) {
            tr.evicted_at.resize(size_t(end), kStillCached);
            tr.copies.resize(size_t(end), 0);
        }
        track_apply(tr, p, r, step, touched);
    }
    ly.tokens = std::max(ly.tokens, end);
    ly.step_t_ns.push_back(row.t_ns);
    ly.plans.push_back(std::move(p));
    ++version;
    return true;
}

void EvictionData::ingest_scores(const storage::ScoreRow& row) {
    if (row.pass != 0 || row.layer < 0 || row.chunk < 0) return;
    EvictionLayerScores& sc = scores[row.layer];
    sc.last_id = std::max(sc.last_id, row.id);
    if (sc.sequence_count == 0 || row.chunk == 0 || row.chunk <= sc.last_chunk) ++sc.sequence_count;
    sc.last_chunk = row.chunk;
    // The sequence is the layer's newest one that started (first cache step) at or before the
    // snapshot (a layer's cache step is recorded just before its scores); counting restarts
    // only when the cache steps are not known, since a sample whose cache never filled has none.
    int seq = sc.sequence_count - 1;
    for (int k = int(sequences.size()) - 1; k >= 0; --k) {
        const auto& layers = sequences[size_t(k)].layers;
        if (size_t(row.layer) < layers.size() && !layers[size_t(row.layer)].step_t_ns.empty() &&
            layers[size_t(row.layer)].step_t_ns.front() <= row.t_ns) {
            seq = k;
            break;
        }
    }
    if (int(sc.sequences.size()) <= seq) sc.sequences.resize(size_t(seq) + 1);
    auto& steps = sc.sequences[size_t(seq)];
    if (int(steps.size()) <= row.chunk) steps.resize(size_t(row.chunk) + 1);
    auto& st = steps[size_t(row.chunk)];
    st.B = row.B, st.G = row.G, st.T = row.T;
    const size_t want = size_t(std::max(0, row.B)) * size_t(std::max(0, row.G)) * size_t(std::max(0, row.T));
    st.values = row.values.size() == want ? row.values : std::vector<float>();
    ++score_version;
}

int EvictionData::resolve_sequence(int sequence) const {
    if (sequences.empty()) return -1;
    if (sequence < 0) return int(sequences.size()) - 1;
    return std::min(sequence, int(sequences.size()) - 1);
}

// =========================================================================================
// [SECTION] images
// =========================================================================================
const char* eviction_colour_name(EvictionColour c) {
    static const char* const kNames[] = {"presence", "score", "age", "quest reads"};
    static_assert(sizeof(kNames) / sizeof(kNames[0]) == size_t(EvictionColour::COUNT), "names out of date");
    return size_t(c) < size_t(EvictionColour::COUNT) ? kNames[size_t(c)] : "unknown";
}

namespace {

const EvictionLayer* find_layer(const EvictionData& d, int sequence, int layer) {
    if (sequence < 0 || size_t(sequence) >= d.sequences.size() || layer < 0) return nullptr;
    const auto& layers = d.sequences[size_t(sequence)].layers;
    return size_t(layer) < layers.size() ? &layers[size_t(layer)] : nullptr;
}

const std::vector<EvictionLayerScores::Step>* find_scores(const EvictionData& d, int sequence, int layer) {
    auto it = d.scores.find(layer);
    if (it == d.scores.end() || sequence < 0 || size_t(sequence) >= it->second.sequences.size()) return nullptr;
    return &it->second.sequences[size_t(sequence)];
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Presence and age, from each token's [inserted, evicted) interval: O(tokens + texels).
void bin_presence(const EvictionLayer& ly, const EvictionTrack& tr, EvictionImage& img, std::vector<double>& held,
                  std::vector<double>& age_sum) {
    const int W = img.width, H = img.height;
    const int64_t tpt = img.tokens_per_texel;
    const int spt = img.steps_per_texel, st_lo = img.step_lo, st_hi = img.step_end;
    std::vector<int32_t> full_n(size_t(H) * size_t(W + 1), 0);  // tokens held over whole columns (difference array)
    std::vector<double> full_ins(size_t(H) * size_t(W + 1), 0);  // their inserted steps, summed
    auto col_start = [&](int x) { return st_lo + x * spt; };
    auto col_end = [&](int x) { return std::min(st_lo + (x + 1) * spt, st_hi); };
    // sum of (s - ins) for s in [a, b)
    auto age_run = [](int64_t a, int64_t b, int64_t ins) { return double(b - a) * (double(a + b - 1) * 0.5 - double(ins)); };
    size_t k = 0;  // step whose chunk holds token p (tokens ascend, so the pointer only advances)
    const int steps = ly.steps();
    for (int64_t p = img.token_lo; p < img.token_end; ++p) {
        while (k < size_t(steps) && ly.plans[k].input_pos + ly.plans[k].n <= p) ++k;
        if (k >= size_t(steps) || p < ly.plans[k].input_pos) continue;
        const int64_t ins = int64_t(k);
        const int32_t ev = size_t(p) < tr.evicted_at.size() ? tr.evicted_at[size_t(p)] : kStillCached;
        const int64_t a = std::max<int64_t>(ins, st_lo), b = std::min<int64_t>(ev == kStillCached ? steps : ev, st_hi);
        if (a >= b) continue;
        const size_t y = size_t((p - img.token_lo) / tpt);
        const int xa = int((a - st_lo) / spt), xb = int((b - 1 - st_lo) / spt);
        double* hrow = held.data() + y * size_t(W);
        double* arow = age_sum.data() + y * size_t(W);
        if (xa == xb) {
            hrow[xa] += double(b - a);
            arow[xa] += age_run(a, b, ins);
            continue;
        }
        const int64_t e = col_end(xa), s0 = col_start(xb);
        hrow[xa] += double(e - a);
        arow[xa] += age_run(a, e, ins);
        hrow[xb] += double(b - s0);
        arow[xb] += age_run(s0, b, ins);
        if (xb > xa + 1) {
            full_n[y * size_t(W + 1) + size_t(xa + 1)] += 1;
            full_n[y * size_t(W + 1) + size_t(xb)] -= 1;
            full_ins[y * size_t(W + 1) + size_t(xa + 1)] += double(ins);
            full_ins[y * size_t(W + 1) + size_t(xb)] -= double(ins);
        }
    }
    for (int y = 0; y < H; ++y) {
        int64_t n = 0;
        double ins_sum = 0;
        for (int x = 0; x < W; ++x) {
            n += full_n[size_t(y) * size_t(W + 1) + size_t(x)];
            ins_sum += full_ins[size_t(y) * size_t(W + 1) + size_t(x)];
            if (n == 0) continue;
            const int64_t c0 = col_start(x), c1 = col_end(x), cnt = c1 - c0;
            const double sum_s = double(cnt) * double(c0 + c1 - 1) * 0.5;
            held[size_t(y) * size_t(W) + size_t(x)] += double(n) * double(cnt);
            age_sum[size_t(y) * size_t(W) + size_t(x)] += double(n) * sum_s - ins_sum * double(cnt);
        }
    }
}

// Scores: walks the steps with the row's slot table; each held token keeps the score of its
// newest snapshot (steps without a full snapshot carry it forward). O(steps x slots).
void bin_scores(const EvictionLayer& ly, const std::vector<EvictionLayerScores::Step>* scores, int row,
                EvictionImage& img, std::vector<double>& sum, std::vector<int32_t>& count) {
    if (!scores) return;
    const int W = img.width;
    std::vector<int32_t> slot_pos(size_t(ly.slots), -1);
    std::vector<float> last(size_t(ly.tokens), kNaN);
    for (int s = 0; s < img.step_end; ++s) {
        apply_plan_to_row(ly.plans[size_t(s)], row, slot_pos.data(), int64_t(slot_pos.size()));
        if (size_t(s) < scores->size()) {
            const auto& st = (*scores)[size_t(s)];
            if (!st.values.empty()) {
                const int64_t rows = int64_t(st.B) * st.G;
                const int64_t r = std::min<int64_t>(row, rows - 1);
                const float* v = st.values.data() + r * st.T;
                const int64_t n = std::min<int64_t>(st.T, int64_t(slot_pos.size()));
                for (int64_t sl = 0; sl < n; ++sl)
                    if (slot_pos[size_t(sl)] >= 0) last[size_t(slot_pos[size_t(sl)])] = v[sl];
            }
        }
        if (s < img.step_lo) continue;
        const int x = (s - img.step_lo) / img.steps_per_texel;
        for (int32_t p : slot_pos) {
            if (p < img.token_lo || p >= img.token_end) continue;
            const float v = last[size_t(p)];
            if (!std::isfinite(v)) continue;
            const size_t i = size_t((p - img.token_lo) / img.tokens_per_texel) * size_t(W) + size_t(x);
            sum[i] += v;
            ++count[i];
        }
    }
}

}  // namespace

EvictionImage build_eviction_image(const EvictionData& data, const EvictionImageSpec& spec) {
    EvictionImage img;
    img.spec = spec;
    const EvictionLayer* ly = find_layer(data, spec.sequence, spec.layer);
    if (!ly || ly->steps() == 0 || ly->tracks.empty()) return img;
    const int steps = ly->steps();
    const int64_t tokens = ly->tokens;
    img.token_lo = std::clamp<int64_t>(spec.token_lo, 0, tokens);
    img.token_end = spec.token_hi < 0 ? tokens : std::clamp<int64_t>(spec.token_hi, img.token_lo, tokens);
    img.step_lo = std::clamp(spec.step_lo, 0, steps);
    img.step_end = spec.step_hi < 0 ? steps : std::clamp(spec.step_hi, img.step_lo, steps);
    if (img.token_end <= img.token_lo || img.step_end <= img.step_lo) return img;
    const int64_t nt = img.token_end - img.token_lo, ns = img.step_end - img.step_lo;
    const int max_h = std::max(1, spec.max_height), max_w = std::max(1, spec.max_width);
    int64_t tpt = 1, spt = 1;
    while (ceil_div(nt, tpt) > max_h) tpt *= 2;
    while (ceil_div(ns, spt) > max_w) spt *= 2;
    const int64_t budget = std::max<int64_t>(1, spec.max_texels);
    while (ceil_div(nt, tpt) * ceil_div(ns, spt) > budget && tpt < nt) tpt *= 2;
    while (ceil_div(nt, tpt) * ceil_div(ns, spt) > budget && spt < ns) spt *= 2;
    img.tokens_per_texel = tpt;
    img.steps_per_texel = int(spt);
    img.width = int(ceil_div(ns, spt));
    img.height = int(ceil_div(nt, tpt));
    const size_t texels = size_t(img.width) * size_t(img.height);
    const int row = std::clamp(spec.row, 0, int(ly->rows) - 1);
    std::vector<double> held(texels, 0.0), age_sum(texels, 0.0);
    bin_presence(*ly, ly->tracks[size_t(row)], img, held, age_sum);
    std::vector<double> score_sum;
    std::vector<int32_t> score_n;
    if (spec.colour == EvictionColour::SCORE || spec.colour == EvictionColour::READS) {
        score_sum.assign(texels, 0.0);
        score_n.assign(texels, 0);
        bin_scores(*ly, find_scores(data, spec.sequence, spec.layer), spec.row, img, score_sum, score_n);
    }
    img.presence.assign(texels, 0.f);
    img.value.assign(texels, kNaN);
    float vmin = std::numeric_limits<float>::infinity(), vmax = -vmin;
    for (int y = 0; y < img.height; ++y) {
        const int64_t bin_tokens = std::min<int64_t>(tpt, img.token_end - (img.token_lo + y * tpt));
        for (int x = 0; x < img.width; ++x) {
            const int64_t bin_steps = std::min<int64_t>(spt, img.step_end - (img.step_lo + x * spt));
            const size_t i = size_t(y) * size_t(img.width) + size_t(x);
            const float frac = float(held[i] / double(bin_tokens * bin_steps));
            img.presence[i] = frac;
            float v = kNaN;
            switch (spec.colour) {
                case EvictionColour::PRESENCE:
                    v = frac;
                    break;
                case EvictionColour::AGE:
                    if (held[i] > 0) v = float(age_sum[i] / held[i]);
                    break;
                case EvictionColour::SCORE:
                case EvictionColour::READS:
                    if (score_n[i] > 0) v = float(score_sum[i] / score_n[i]);
                    break;
                case EvictionColour::COUNT:
                    break;
            }
            img.value[i] = v;
            if (std::isfinite(v)) vmin = std::min(vmin, v), vmax = std::max(vmax, v);
        }
    }
    if (vmin <= vmax) img.value_min = vmin, img.value_max = vmax;
    if (spec.colour == EvictionColour::READS) img.value_min = 0, img.value_max = 1;  // shares: one fixed scale for every chunk
    colour_eviction_image(img);
    return img;
}

void colour_eviction_image(EvictionImage& img) {
    const size_t texels = size_t(img.width) * size_t(img.height);
    img.rgba.resize(texels * 4);
    const Colour* lut = colormap_table();
    const Colour held_no_value = pack_rgba(80, 80, 90);
    // A shared range (compare) colours by it; value_min/value_max stay this image's own values.
    const bool shared = img.spec.fixed_range && img.spec.colour != EvictionColour::READS;
    const float lo = shared ? img.spec.range_lo : img.value_min, span = (shared ? img.spec.range_hi : img.value_max) - lo;
    for (size_t i = 0; i < texels; ++i) {
        Colour c = kNoDataColour;
        const float f = img.presence[i];
        if (f > 0) {
            if (img.spec.colour == EvictionColour::PRESENCE) {
                // Partly held texels (binned) are darker; fully held ones the top of the map.
                c = lut[size_t(std::lround((0.25f + 0.75f * std::min(f, 1.f)) * 255.f))];
            } else if (!std::isfinite(img.value[i])) {
                c = held_no_value;
            } else {
                const float t = span > 0 ? (img.value[i] - lo) / span : 0.5f;
                c = lut[size_t(std::lround(std::clamp(t, 0.f, 1.f) * 255.f))];
            }
        }
        img.rgba[i * 4 + 0] = colour_r(c);
        img.rgba[i * 4 + 1] = colour_g(c);
        img.rgba[i * 4 + 2] = colour_b(c);
        img.rgba[i * 4 + 3] = colour_a(c);
    }
}

// =========================================================================================
// [SECTION] hit testing and hover details
// =========================================================================================
EvictionHit eviction_hit_test(const AxisRange& steps, const AxisRange& tokens, ImVec2 p0, ImVec2 p1, ImVec2 pt,
                              int num_steps, int64_t num_tokens) {
    EvictionHit h;
    if (pt.x < p0.x || pt.y < p0.y || pt.x >= p1.x || pt.y >= p1.y) return h;
    const double s = pixel_to_axis(steps, pt.x, p0.x, p1.x), t = pixel_to_axis(tokens, pt.y, p0.y, p1.y);
    if (s < 0 || t < 0) return h;
    h.step = int(std::floor(s));
    h.token = int64_t(std::floor(t));
    h.valid = h.step < num_steps && h.token < num_tokens;
    return h;
}

TokenAtStep eviction_token_info(const EvictionData& data, int sequence, int layer, int row, int64_t token, int step) {
    TokenAtStep info;
    info.token = token;
    info.step = step;
    const EvictionLayer* ly = find_layer(data, sequence, layer);
    if (!ly || ly->tracks.empty() || token < 0 || token >= ly->tokens || step < 0 || step >= ly->steps()) return info;
    const int r = std::clamp(row, 0, int(ly->rows) - 1);
    const EvictionTrack& tr = ly->tracks[size_t(r)];
    info.inserted_step = ly->inserted_step(token);
    const int32_t ev = size_t(token) < tr.evicted_at.size() ? tr.evicted_at[size_t(token)] : kStillCached;
    info.evicted_step = ev == kStillCached ? -1 : ev;
    const auto* scores = find_scores(data, sequence, layer);
    std::vector<int32_t> slot_pos(size_t(ly->slots), -1);
    float score = kNaN;
    for (int s = 0; s <= step; ++s) {
        apply_plan_to_row(ly->plans[size_t(s)], r, slot_pos.data(), int64_t(slot_pos.size()));
        if (scores && size_t(s) < scores->size() && !(*scores)[size_t(s)].values.empty()) {
            const auto& st = (*scores)[size_t(s)];
            const int64_t rr = std::min<int64_t>(row, int64_t(st.B) * st.G - 1);
            for (int64_t sl = 0; sl < std::min<int64_t>(st.T, int64_t(slot_pos.size())); ++sl)
                if (slot_pos[size_t(sl)] == token) {
                    score = st.values[size_t(rr * st.T + sl)];
                    break;
                }
        }
    }
    for (size_t sl = 0; sl < slot_pos.size(); ++sl)
        if (slot_pos[sl] == token) {
            info.slot = int(sl);
            break;
        }
    info.cached = info.slot >= 0;
    if (info.cached) {
        info.age = step - info.inserted_step;
        info.score = score;
    }
    return info;
}

std::vector<int32_t> eviction_slot_tokens(const EvictionData& data, int sequence, int layer, int row, int step) {
    const EvictionLayer* ly = find_layer(data, sequence, layer);
    if (!ly || ly->tracks.empty() || step < 0 || step >= ly->steps()) return {};
    const int r = std::clamp(row, 0, int(ly->rows) - 1);
    std::vector<int32_t> slot_pos(size_t(ly->slots), -1);
    for (int s = 0; s <= step; ++s) apply_plan_to_row(ly->plans[size_t(s)], r, slot_pos.data(), int64_t(slot_pos.size()));
    return slot_pos;
}

// =========================================================================================
// [SECTION] refresh and textures
// =========================================================================================
bool refresh_eviction_map(EvictionMapViewState& s, storage::SessionReader& reader) {
    bool any = false;
    try {
        using Clock = std::chrono::steady_clock;
        const auto start = Clock::now();
        s.tokens.run = s.run;
        any |= refresh_run_tokens(s.tokens, reader);
        int64_t live = 0;
        try {  // a run the session does not (yet) hold has no known length: the axis fits the data
            const storage::RunInfo info = reader.run(s.run);
            if (s.layer_kinds.empty() && !info.summary.empty()) {
                s.layer_kinds = layer_kinds_of_summary(info.summary);
                any |= !s.layer_kinds.empty();
            }
            const int64_t planned = std::atoll(storage::run_config_value(info.config, "data.seq_length").c_str());
            live = storage::run_status_final(info.status) ? 0 : std::max<int64_t>(0, planned);
        } catch (const std::exception&) {
        }
        any |= live != s.live_sample_tokens;
        s.live_sample_tokens = live;
        EvictionData& d = s.data;
        // Layers 0 .. known (one past the known ones, to discover the next); a layer's rows come
        // whole, so its cursor stays exact; the pass resumes where the budget stopped it.
        for (int layer = d.next_layer;; ++layer) {
            const int known = d.num_layers();
            if (layer > known) {
                d.next_layer = 0;
                break;
            }
            if (d.layer_cursor.size() <= size_t(layer)) d.layer_cursor.resize(size_t(layer) + 1, 0);
            std::vector<storage::CacheStepRow> rows = reader.cache_steps(s.run, layer, d.layer_cursor[size_t(layer)]);
            // The reader orders by chunk; sequences restart chunks, so replay in commit order.
            std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
            for (const auto& r : rows) {
                any |= d.ingest(r);
                d.layer_cursor[size_t(layer)] = std::max(d.layer_cursor[size_t(layer)], r.id);
            }
            if (rows.empty() && layer == known) {  // no new layer
                d.next_layer = 0;
                break;
            }
            if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > s.refresh_budget_ms) {
                d.next_layer = layer + 1;
                any = true;  // more may be waiting: the host should refresh again
                break;
            }
        }
        auto read_scores = [&](int layer) {
            EvictionLayerScores& sc = s.data.scores[layer];
            std::vector<storage::ScoreRow> sr = reader.score_snapshots(s.run, layer, sc.last_id, true);
            std::sort(sr.begin(), sr.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
            for (const auto& r : sr) s.data.ingest_scores(r);
            any |= !sr.empty();
        };
        if ((s.colour == EvictionColour::SCORE || s.colour == EvictionColour::READS) && !s.all_layers) {
            read_scores(s.layer);
        } else if (s.colour == EvictionColour::READS && s.all_layers) {
            // Quest's reads in every thumbnail need every layer's score stream (one share per
            // position and chunk): read layer after layer within the budget, like the cache steps.
            for (int layer = d.next_score_layer; layer < d.num_layers(); ++layer) {
                read_scores(layer);
                d.next_score_layer = layer + 1;
                if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > s.refresh_budget_ms &&
                    layer + 1 < d.num_layers()) {
                    any = true;  // more layers wait: the host should refresh again
                    break;
                }
            }
            if (d.next_score_layer >= d.num_layers()) d.next_score_layer = 0;
        }
        s.error.clear();
    } catch (const std::exception& e) {
        s.error = e.what();
    }
    return any;
}

EvictionImageSpec eviction_main_spec(const EvictionMapViewState& s, float frame_height_px) {
    EvictionImageSpec spec;
    spec.sequence = s.data.resolve_sequence(s.sequence);
    spec.layer = s.layer;
    spec.row = s.head;
    spec.colour = s.colour;
    spec.max_width = s.max_texture_width;
    spec.max_height = s.max_texture_height;
    spec.max_texels = s.max_texels;
    if (s.fixed_range && (s.colour == EvictionColour::AGE || s.colour == EvictionColour::SCORE))
        spec.fixed_range = true, spec.range_lo = s.range_lo, spec.range_hi = s.range_hi;
    const EvictionLayer* ly = find_layer(s.data, spec.sequence, s.layer);
    if (!ly || s.follow) return spec;
    // Zoomed in: when the full image's texels would be taller than ~2 pixels, bin only a
    // window around the visible positions. Window edges snap to a grid of half the visible
    // span so panning within it does not rebuild the texture every frame.
    int64_t tpt = 1;
    while ((ly->tokens + tpt - 1) / tpt > spec.max_height) tpt *= 2;
    const double vis = std::max(1.0, s.tokens_range.span());
    if (tpt > 1 && vis / double(tpt) < frame_height_px * 0.5) {
        double q = 1;
        while (q * 2 <= vis * 0.5) q *= 2;
        const double lo = std::floor((s.tokens_range.lo - vis * 0.5) / q) * q;
        const double hi = std::ceil((s.tokens_range.hi + vis * 0.5) / q) * q;
        spec.token_lo = std::max<int64_t>(0, int64_t(lo));
        spec.token_hi = std::min<int64_t>(ly->tokens, int64_t(hi));
    }
    return spec;
}

namespace {
void upload(EvictionMapViewState::Texture& t, TextureHost* host) {
    if (!host) return;
    if (t.image.width == 0 || t.image.height == 0) {
        if (t.id) host->release(t.id);
        t.id = 0;
        return;
    }
    t.id = host->upload_rgba(t.id, t.image.width, t.image.height, t.image.rgba.data());
}
}  // namespace

void update_eviction_textures(EvictionMapViewState& s, TextureHost* host, float frame_height_px) {
    const uint64_t sv = s.colour == EvictionColour::SCORE || s.colour == EvictionColour::READS ? s.data.score_version : 0;
    if (!s.all_layers) {
        const EvictionImageSpec spec = eviction_main_spec(s, frame_height_px);
        if (!s.main.valid || !(s.main.image.spec == spec) || s.main.version != s.data.version || s.main.score_version != sv) {
            s.main.image = build_eviction_image(s.data, spec);
            s.main.version = s.data.version;
            s.main.score_version = sv;
            s.main.valid = true;
            upload(s.main, host);
        }
        return;
    }
    const int seq = s.data.resolve_sequence(s.sequence);
    const int n = seq >= 0 ? int(s.data.sequences[size_t(seq)].layers.size()) : 0;
    if (int(s.layer_textures.size()) > n) {
        for (size_t i = size_t(n); i < s.layer_textures.size(); ++i)
            if (host && s.layer_textures[i].id) host->release(s.layer_textures[i].id);
        s.layer_textures.resize(size_t(n));
    }
    s.layer_textures.resize(size_t(n));
    // Many layers at once would stall one frame (24 x 128k tokens: ~60 ms): build until the
    // budget is spent and continue next frame; stale or missing thumbnails show meanwhile.
    const auto start = std::chrono::steady_clock::now();
    int built = 0;
    for (int l = 0; l < n; ++l) {
        EvictionImageSpec spec;
        spec.sequence = seq;
        spec.layer = l;
        spec.row = s.head;
        // Scores need one layer's snapshots at a time: small multiples fall back to presence.
        // Quest's reads are a share on a fixed 0..1 scale, comparable across layers: kept.
        spec.colour = s.colour == EvictionColour::SCORE ? EvictionColour::PRESENCE : s.colour;
        spec.max_width = s.small_width;
        spec.max_height = s.small_height;
        spec.max_texels = int64_t(s.small_width) * s.small_height;
        auto& t = s.layer_textures[size_t(l)];
        if (t.valid && t.image.spec == spec && t.version == s.data.version && t.score_version == sv) continue;
        if (built > 0 && std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() > s.build_budget_ms)
            break;
        ++built;
        t.image = build_eviction_image(s.data, spec);
        t.version = s.data.version;
        t.score_version = sv;
        t.valid = true;
        upload(t, host);
    }
}

void release_eviction_textures(EvictionMapViewState& s, TextureHost* host) {
    if (host) {
        if (s.main.id) host->release(s.main.id);
        for (auto& t : s.layer_textures)
            if (t.id) host->release(t.id);
    }
    s.main = {};
    s.layer_textures.clear();
}

EvictionColourKey eviction_colour_key(const EvictionImage& img) {
    EvictionColourKey k;
    switch (img.spec.colour) {
        case EvictionColour::PRESENCE:
            // colour_eviction_image: a texel's held share f in (0, 1] maps to t = 0.25 + 0.75 f.
            k.title = "share held", k.lo = 0, k.hi = 1, k.t_lo = 0.25f, k.t_hi = 1;
            break;
        case EvictionColour::READS:
            k.title = "share of queries reading the page", k.lo = 0, k.hi = 1;
            break;
        case EvictionColour::AGE:
        case EvictionColour::SCORE:
        case EvictionColour::COUNT:
            k.title = img.spec.colour == EvictionColour::SCORE ? "score" : "age (steps)";
            k.lo = img.value_max >= img.value_min ? img.value_min : 0;
            k.hi = img.value_max >= img.value_min ? img.value_max : 1;
            if (img.spec.fixed_range) k.lo = img.spec.range_lo, k.hi = img.spec.range_hi;
            break;
    }
    return k;
}

// =========================================================================================
// [SECTION] drawing
// =========================================================================================
namespace {
constexpr const char* kNotCachedLabel = "not cached";
}  // namespace

float eviction_colour_key_width(const EvictionColourKey& k) {
    return std::max(colour_bar_width(k.lo, k.hi, AxisUnit::NUMBER, k.title), 26 + ImGui::CalcTextSize(kNotCachedLabel).x + 8);
}

// Colour bar and "not cached" swatch right of a map (see eviction_colour_key).
void draw_eviction_colour_key(ImDrawList* dl, const EvictionColourKey& k, ImVec2 p0, ImVec2 p1) {
    const float line = ImGui::GetTextLineHeight();
    const float bar_bottom = p1.y - line - 6;  // a row under the bar for the swatch
    if (bar_bottom - p0.y < 2 * line) return;
    draw_colour_bar(dl, p0, ImVec2(p1.x, bar_bottom), k.lo, k.hi, AxisUnit::NUMBER, k.title, false, k.t_lo, k.t_hi);
    const float sy = p1.y - line;
    dl->AddRectFilled(ImVec2(p0.x + 8, sy + 2), ImVec2(p0.x + 20, sy + line - 2), kNoDataColour);
    dl->AddRect(ImVec2(p0.x + 7, sy + 1), ImVec2(p0.x + 21, sy + line - 1), IM_COL32(200, 200, 200, 120));
    dl->AddText(ImVec2(p0.x + 26, sy), IM_COL32(210, 210, 210, 235), kNotCachedLabel);
}

namespace {

// Draws one image into `f` for the state's visible window; returns the screen rectangle of the data.
void draw_image(ImDrawList* dl, const PlotFrame& f, const EvictionMapViewState::Texture& t, const AxisRange& xs,
                const AxisRange& ys) {
    dl->AddRectFilled(f.p0, f.p1, kNoDataColour);
    const EvictionImage& im = t.image;
    if (!t.id || im.width == 0) return;
    const double x0 = im.step_lo, x1 = im.step_lo + double(im.width) * im.steps_per_texel;
    const double y0 = double(im.token_lo), y1 = double(im.token_lo) + double(im.height) * double(im.tokens_per_texel);
    const ImVec2 a(float(axis_to_pixel(xs, x0, f.p0.x, f.p1.x)), float(axis_to_pixel(ys, y0, f.p0.y, f.p1.y)));
    const ImVec2 b(float(axis_to_pixel(xs, x1, f.p0.x, f.p1.x)), float(axis_to_pixel(ys, y1, f.p0.y, f.p1.y)));
    dl->PushClipRect(f.p0, f.p1, true);
    dl->AddImage(texture_id(t.id), a, b);
    dl->PopClipRect();
}

// Every position the search marks, as a faint line across the map and a solid tick on its left
// edge (a position under a texel of many still shows: lines are at least one pixel).
void draw_search_marks(ImDrawList* dl, const PlotFrame& f, const TokenSearch& search, const AxisRange& ys) {
    if (!search.active() || search.result.positions.empty()) return;
    dl->PushClipRect(f.p0, f.p1, true);
    const auto lo = std::lower_bound(search.result.positions.begin(), search.result.positions.end(), int64_t(std::floor(ys.lo)));
    const float px_per_token = float(f.height() / std::max(1e-9, ys.hi - ys.lo));
    for (auto it = lo; it != search.result.positions.end() && double(*it) < ys.hi; ++it) {
        const float y0 = float(axis_to_pixel(ys, double(*it), f.p0.y, f.p1.y));
        const float y1 = std::max(y0 + 1.f, y0 + px_per_token);
        dl->AddRectFilled(ImVec2(f.p0.x, y0), ImVec2(f.p1.x, y1), (kSearchMarkColour & 0x00ffffff) | 0x38000000);
        dl->AddRectFilled(ImVec2(f.p0.x, y0), ImVec2(f.p0.x + 6, y1), kSearchMarkColour);
    }
    dl->PopClipRect();
}

void hover_tooltip(EvictionMapViewState& s, int seq, int layer, const EvictionHit& h) {
    if (!s.hovered || s.hover.token != h.token || s.hover.step != h.step || s.hover_layer != layer ||
        s.hover_version != s.data.version + s.data.score_version) {
        s.hover = eviction_token_info(s.data, seq, layer, s.head, h.token, h.step);
        s.hover_layer = layer;
        s.hover_version = s.data.version + s.data.score_version;
        s.hovered = true;
    }
    const TokenAtStep& i = s.hover;
    ImGui::BeginTooltip();
    ImGui::Text("%s  head %d  step %d", layer_label(layer, s.layer_kinds).c_str(), s.head, i.step);
    ImGui::Text("token position %lld", (long long)i.token);
    if (const std::string text = token_label(s.tokens.sample(seq), i.token); !text.empty()) ImGui::Text("token %s", text.c_str());
    if (s.search.active() && s.search.marked(i.token)) ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kSearchMarkColour), "matches the search");
    if (i.cached) {
        ImGui::Text("slot %d  age %d steps", i.slot, i.age);
        if (std::isfinite(i.score)) ImGui::Text("score %.6g", double(i.score));
        else ImGui::TextDisabled("score not recorded at this step");
    } else {
        ImGui::TextDisabled(i.inserted_step > i.step || i.inserted_step < 0 ? "not written yet" : "not in the cache");
    }
    if (i.inserted_step >= 0) ImGui::Text("inserted at step %d", i.inserted_step);
    if (i.evicted_step >= 0) ImGui::Text("evicted at step %d", i.evicted_step);
    else if (i.inserted_step >= 0) ImGui::TextDisabled("never evicted (so far)");
    ImGui::EndTooltip();
}

}  // namespace

void DrawEvictionMapView(EvictionMapViewState& s, TextureHost* host, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) {
        const ImVec2 avail = ImGui::GetContentRegionAvail();
        if (size.x <= 0) size.x = avail.x;
        if (size.y <= 0) size.y = avail.y;
    }
    ImGui::PushID("eviction_map");
    ImGui::BeginGroup();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    const int seq = s.data.resolve_sequence(s.sequence);
    if (seq < 0) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state("no cache steps recorded yet (the replay log appears once the first chunk is cached)");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    const EvictionSequence& sq = s.data.sequences[size_t(seq)];
    const int num_layers = int(sq.layers.size());
    s.layer = std::clamp(s.layer, 0, std::max(0, num_layers - 1));
    const EvictionLayer* ly = find_layer(s.data, seq, s.layer);
    int heads = ly ? int(ly->rows) : 1;
    if (auto it = s.data.scores.find(s.layer); it != s.data.scores.end() && size_t(seq) < it->second.sequences.size())
        for (const auto& st : it->second.sequences[size_t(seq)]) heads = std::max(heads, st.B * st.G);
    s.head = std::clamp(s.head, 0, std::max(0, heads - 1));

    // ---- toolbar ----
    if (s.toolbar && s.data.sequences.size() > 1) {
        int shown = seq;
        ImGui::SetNextItemWidth(120);
        if (ImGui::SliderInt("sample", &shown, 0, int(s.data.sequences.size()) - 1)) s.sequence = shown;
        ImGui::SameLine();
    }
    if (s.toolbar) {
        if (!s.all_layers && num_layers > 1) {
            // the slider names the shown layer's type: "3 (window 512)"
            const std::string fmt = "%d" + layer_kind_suffix(s.layer, s.layer_kinds);
            ImGui::SetNextItemWidth(fmt.size() > 2 ? 260 : 160);
            ImGui::SliderInt("layer", &s.layer, 0, num_layers - 1, fmt.c_str());
            ImGui::SameLine();
        }
        if (heads > 1) {
            ImGui::SetNextItemWidth(120);
            ImGui::SliderInt("head", &s.head, 0, heads - 1);
            ImGui::SameLine();
        }
        for (int c = 0; c < int(EvictionColour::COUNT); ++c) {
            if (ImGui::RadioButton(eviction_colour_name(EvictionColour(c)), s.colour == EvictionColour(c)))
                s.colour = EvictionColour(c);
            ImGui::SameLine();
        }
        ImGui::Checkbox("all layers", &s.all_layers);
        ImGui::SameLine();
        if (ImGui::Button("fit")) s.follow = true;
        ImGui::SameLine();
        DrawTokenSearchBox(s.search, s.tokens, seq);
    } else {
        update_token_search(s.search, s.tokens, seq);
    }
    const int steps = s.all_layers ? sq.steps() : (ly ? ly->steps() : 0);
    const int64_t tokens = s.all_layers ? sq.tokens() : (ly ? ly->tokens : 0);
    if (s.follow) {
        s.steps_range = {0, double(std::max(1, steps))};
        s.tokens_range = {0, double(std::max<int64_t>({1, tokens, s.live_sample_tokens}))};
    }
    const EvictionImage& mi = s.main.image;
    // The compact form (compare's small maps) must fit the map's width.
    if (!s.all_layers && ly && !s.toolbar)
        ImGui::TextDisabled("%d step%s, %lld slots%s", steps, steps == 1 ? "" : "s", (long long)ly->slots,
                            ly->error.empty() ? "" : " (log damaged)");
    else if (!s.all_layers && ly)
        ImGui::TextDisabled("%d steps x %lld positions, %lld slots; texel = %lld positions x %d steps%s", steps,
                            (long long)tokens, (long long)ly->slots, (long long)mi.tokens_per_texel, mi.steps_per_texel,
                            ly->error.empty() ? "" : " (replay log damaged: see error)");
    else
        ImGui::TextDisabled("%d layers, %d steps x %lld positions (%s); in each: x = chunk step, y = token position", num_layers,
                            steps, (long long)tokens,
                            s.colour == EvictionColour::SCORE ? "presence: scores show one layer at a time"
                                                              : eviction_colour_name(s.colour));
    const float used = ImGui::GetCursorPosY() - top;
    const ImVec2 body(size.x, std::max(40.f, size.y - used - ImGui::GetStyle().ItemSpacing.y));

    ImDrawList* dl = ImGui::GetWindowDrawList();
    if (!s.all_layers) {
        update_eviction_textures(s, host, body.y);
        const EvictionColourKey key = eviction_colour_key(s.main.image);
        const float bar_w = s.colour_key ? eviction_colour_key_width(key) : 0.f;
        const AxisSpec xs{AxisUnit::INTEGER, "chunk step"}, ys{AxisUnit::INTEGER, "token position"};
        const PlotMargins m = plot_margins(&xs, &ys, &s.tokens_range, body.y, bar_w);
        const PlotFrame f = begin_plot_frame("##map", body, m);
        if (plot_zoom_pan(f, s.steps_range, 0, std::max(1, steps), &s.tokens_range, 0, double(std::max<int64_t>(1, tokens)),
                          true))
            s.follow = false;
        if (f.hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) s.follow = true;
        draw_image(dl, f, s.main, s.steps_range, s.tokens_range);
        draw_search_marks(dl, f, s.search, s.tokens_range);
        draw_x_axis(dl, f, s.steps_range, xs);
        draw_y_axis(dl, f, s.tokens_range, ys, true);
        if (s.colour_key) draw_eviction_colour_key(dl, key, ImVec2(f.p1.x, f.p0.y), ImVec2(f.outer1.x, f.p1.y));
        if (f.hovered) {
            const EvictionHit h = eviction_hit_test(s.steps_range, s.tokens_range, f.p0, f.p1, f.mouse, steps, tokens);
            if (h.valid) hover_tooltip(s, seq, s.layer, h);
        } else {
            s.hovered = false;
        }
    } else {
        update_eviction_textures(s, host, body.y);
        // One colour key for every thumbnail, at the right.
        EvictionColourKey key = eviction_colour_key(s.layer_textures.empty() ? EvictionImage{} : s.layer_textures.front().image);
        for (const auto& t : s.layer_textures)
            if (t.valid && t.image.spec.colour != EvictionColour::PRESENCE && t.image.value_max >= t.image.value_min) {
                key.lo = std::min(key.lo, double(t.image.value_min)), key.hi = std::max(key.hi, double(t.image.value_max));
            }
        const float bar_w = eviction_colour_key_width(key);
        const ImVec2 grid0 = ImGui::GetCursorScreenPos();
        const float line = ImGui::GetTextLineHeight();
        draw_eviction_colour_key(dl, key, ImVec2(grid0.x + body.x - bar_w, grid0.y + line + 4),
                                 ImVec2(grid0.x + body.x, grid0.y + body.y - 2 * line - 8));
        const float grid_w = std::max(16.f, body.x - bar_w);
        const int cols = std::max(1, int(std::sqrt(double(num_layers) * grid_w / std::max(1.f, body.y)) + 0.5));
        const int rows_n = (num_layers + cols - 1) / cols;
        const float cw = grid_w / cols - 4, ch = body.y / std::max(1, rows_n) - 4;
        bool any_hover = false;
        for (int l = 0; l < num_layers; ++l) {
            if (l % cols) ImGui::SameLine(0, 4);
            ImGui::PushID(l);
            const PlotFrame f = begin_plot_frame("##small", ImVec2(std::max(8.f, cw), std::max(8.f, ch)));
            if (plot_zoom_pan(f, s.steps_range, 0, std::max(1, steps), &s.tokens_range, 0,
                              double(std::max<int64_t>(1, tokens)), true))
                s.follow = false;
            if (size_t(l) < s.layer_textures.size()) draw_image(dl, f, s.layer_textures[size_t(l)], s.steps_range, s.tokens_range);
            draw_search_marks(dl, f, s.search, s.tokens_range);
            const std::string label = layer_label(l, s.layer_kinds);
            dl->AddText(ImVec2(f.p0.x + 3, f.p0.y + 2), IM_COL32(230, 230, 230, 220), label.c_str());
            if (f.hovered) {
                const EvictionHit h = eviction_hit_test(s.steps_range, s.tokens_range, f.p0, f.p1, f.mouse, steps, tokens);
                if (h.valid) {
                    hover_tooltip(s, seq, l, h);
                    any_hover = true;
                }
                if (ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {  // open this layer alone
                    s.layer = l;
                    s.all_layers = false;
                }
            }
            ImGui::PopID();
        }
        if (!any_hover) s.hovered = false;
    }
    ImGui::EndGroup();
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class EvictionMapSlot final : public StateSlot<EvictionMapViewState> {
   public:
    void select(const ViewSelection& sel) override {
        release(sel.textures);
        state = {};
        state.run = sel.runs.empty() ? 0 : sel.runs.front();
    }
    bool refresh(storage::SessionReader& r) override { return refresh_eviction_map(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        DrawEvictionMapView(state, t, size);
    }
    void release(TextureHost* t) override { release_eviction_textures(state, t); }
};
}  // namespace

ViewEntry eviction_map_view_entry() {
    return {.name = "eviction map", .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<EvictionMapSlot>(); }};
}

}  // namespace kv::views
