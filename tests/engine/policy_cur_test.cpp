// cur against kvpress' CURPress in f64 (CurDKV): squared key and value norms from the raw
// k and v, normalised within windows of `w` positions (over the cached tokens of the window),
// combined, divided by the row's sum; the first `sinks` positions score 1.
#include <map>

#include "policy_reference_util.h"

namespace kv::test {
namespace {

double sq(const std::vector<float>& x) {
    double s = 0;
    for (float e : x) s += double(e) * double(e);
    return s;
}

std::vector<double> cur_reference(const LayerHarness& h, int64_t sinks, int64_t w, int kind) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L;
    const auto& pos = pol.token_positions();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::map<int64_t, double> ksum, vsum;  // per window
        for (int64_t j = 0; j < T; ++j) {
            const auto& kv = h.history[size_t(r)].at(pos[size_t(r * L + j)]);
            const int64_t win = w > 0 ? pos[size_t(r * L + j)] / w : 0;
            ksum[win] += sq(kv.first), vsum[win] += sq(kv.second);
        }
        std::vector<double> s((size_t)T);
        double total = 0;
        for (int64_t j = 0; j < T; ++j) {
            const auto& kv = h.history[size_t(r)].at(pos[size_t(r * L + j)]);
            const int64_t win = w > 0 ? pos[size_t(r * L + j)] / w : 0;
            const double k2 = sq(kv.first) / (w > 0 ? ksum[win] : 1.0), v2 = sq(kv.second) / (w > 0 ? vsum[win] : 1.0);
            total += s[size_t(j)] = kind == 0 ? k2 : kind == 1 ? v2 : kind == 2 ? (k2 + v2) / 2 : k2 * v2;
        }
        for (int64_t j = 0; j < T; ++j) out[size_t(r * L + j)] = pos[size_t(r * L + j)] < sinks ? 1.0 : s[size_t(j)] / total;
    }
    return out;
}

TEST(CUR, DefaultScoresAndChoicesEqualTheF64Reference) {
    // kvpress' defaults: 4 sinks, windows of 16 positions, key x value leverage
    check_policy_against_reference("cur-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return cur_reference(h, 4, 16, 3); });
}

TEST(CUR, SmallWindowsAndEveryLeverageKindEqualTheF64Reference) {
    for (int kind : {0, 1, 2}) {
        SCOPED_TRACE(kind);
        check_policy_against_reference(
            "cur-default", [kind](KVCacheConfig& c) { c.policy_options = {{"cur_num_sinks", 1}, {"cur_window", 5}, {"cur_leverage", kind}}; },
            [kind](const LayerHarness& h, int64_t, int64_t) { return cur_reference(h, 1, 5, kind); });
    }
    check_policy_against_reference(
        "cur-default", [](KVCacheConfig& c) { c.policy_options = {{"cur_num_sinks", 0}, {"cur_window", 0}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return cur_reference(h, 0, 0, 3); });
}

}  // namespace
}  // namespace kv::test
