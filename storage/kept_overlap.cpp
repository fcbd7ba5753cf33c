// Kept-slot overlap (see kept_overlap.h).
#include "storage/kept_overlap.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "storage/cache_step_plan.h"

namespace kv::storage {

double KeptOverlap::share_of_a() const { return held_a ? double(both) / double(held_a) : NAN; }
double KeptOverlap::share_of_b() const { return held_b ? double(both) / double(held_b) : NAN; }

namespace {

// One layer's cache of one run replayed step by step: per row, the token position in each slot.
struct Replay {
    std::vector<SlotPlan> plans;  // pass-0 steps of the layer, in step order
    std::vector<std::vector<int32_t>> rows;
    size_t next = 0;
    int64_t slots = 0;
    int64_t sample = -1;  // samples started so far, minus one

    // (sample, tokens processed) after the next plan: where the two runs' steps line up.
    std::pair<int64_t, int64_t> next_key() const {
        const SlotPlan& p = plans[next];
        return {sample + (p.input_pos == 0 ? 1 : 0), p.input_pos + p.n};
    }

    // Applies the next plan; false when there is none.
    bool step() {
        if (next >= plans.size()) return false;
        const SlotPlan& p = plans[next++];
        if (p.input_pos == 0) ++sample;
        if (p.input_pos == 0) rows.assign(rows.empty() ? 1 : rows.size(), std::vector<int32_t>(size_t(slots), -1));
        if (rows.empty()) rows.assign(1, std::vector<int32_t>(size_t(slots), -1));
        // Slots were shared until now: every row starts from row 0's state.
        if (p.rows > int64_t(rows.size())) rows.resize(size_t(p.rows), rows[0]);
        for (size_t r = 0; r < rows.size(); ++r) apply_plan_to_row(p, p.rows == 1 ? 0 : int64_t(r), rows[r].data(), slots);
        return true;
    }
    const std::vector<int32_t>& row(size_t r) const { return rows[std::min(r, rows.size() - 1)]; }
};

// Pass-0 plans per layer, in id order; a layer stops at its first damaged row.
std::map<int32_t, Replay> replays(const std::vector<CacheStepRow>& steps) {
    std::vector<const CacheStepRow*> order;
    for (const auto& s : steps)
        if (s.pass == 0 && s.layer >= 0) order.push_back(&s);
    std::stable_sort(order.begin(), order.end(), [](const CacheStepRow* x, const CacheStepRow* y) { return x->id < y->id; });
    std::map<int32_t, Replay> out;
    std::map<int32_t, bool> broken;
    for (const CacheStepRow* s : order) {
        if (broken[s->layer]) continue;
        SlotPlan p;
        std::string why;
        if (!decode_cache_step(*s, p, why)) {
            broken[s->layer] = true;
            continue;
        }
        Replay& r = out[s->layer];
        int64_t need = std::max<int64_t>(p.length_after, s->cache_length);
        for (int32_t t : p.targets) need = std::max<int64_t>(need, int64_t(t) + 1);
        for (int32_t t : p.move_to) need = std::max<int64_t>(need, int64_t(t) + 1);
        r.slots = std::max(r.slots, need);
        r.plans.push_back(std::move(p));
    }
    return out;
}

}  // namespace

std::vector<KeptOverlap> kept_slot_overlap(const std::vector<CacheStepRow>& a, const std::vector<CacheStepRow>& b) {
    auto ra = replays(a), rb = replays(b);
    std::map<int32_t, KeptOverlap> out;
    for (auto& [layer, r] : ra) out[layer].layer = layer;
    for (auto& [layer, r] : rb) out[layer].layer = layer;
    std::vector<uint8_t> mark;
    for (auto& [layer, o] : out) {
        if (!ra.count(layer) || !rb.count(layer)) continue;
        Replay &x = ra[layer], &y = rb[layer];
        while (x.next < x.plans.size() && y.next < y.plans.size()) {
            // A step whose end the other run's steps skip (a different chunking) is replayed alone.
            const auto kx = x.next_key(), ky = y.next_key();
            if (kx != ky) {
                (kx < ky ? x : y).step();
                ++o.unmatched_steps;
                continue;
            }
            x.step(), y.step();
            ++o.steps;
            const size_t rows = std::max(x.rows.size(), y.rows.size());
            for (size_t r = 0; r < rows; ++r) {
                const auto &sx = x.row(r), &sy = y.row(r);
                // Sets of positions: a token copied into two slots counts once.
                for (int32_t pos : sx) {
                    if (pos < 0) continue;
                    if (mark.size() <= size_t(pos)) mark.resize(size_t(pos) + 1, 0);
                    if (!(mark[size_t(pos)] & 1)) mark[size_t(pos)] |= 1, ++o.held_a;
                }
                for (int32_t pos : sy) {
                    if (pos < 0) continue;
                    if (mark.size() <= size_t(pos)) mark.resize(size_t(pos) + 1, 0);
                    if (mark[size_t(pos)] & 2) continue;
                    mark[size_t(pos)] |= 2;
                    ++o.held_b;
                    o.both += mark[size_t(pos)] & 1;
                }
                for (int32_t pos : sx)
                    if (pos >= 0) mark[size_t(pos)] = 0;
                for (int32_t pos : sy)
                    if (pos >= 0) mark[size_t(pos)] = 0;
            }
        }
        // Steps left over once either run ran out are unmatched too.
        o.unmatched_steps += int64_t(x.plans.size() - x.next) + int64_t(y.plans.size() - y.next);
    }
    std::vector<KeptOverlap> v;
    for (auto& [layer, o] : out) v.push_back(o);
    return v;
}

}  // namespace kv::storage
