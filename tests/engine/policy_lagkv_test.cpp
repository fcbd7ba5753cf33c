// lagkv against kvpress' LagKVPress in f64, applied to the cached tokens in position order as the
// press's sequence: n_sink sinks, blocks of lag tokens each scored by the softmax over the block of
// the unbiased std over channels of (x - min ref) / (max ref - min ref) (ref: the next block), keys
// and values averaged; ranked within the block / lag unless cross scoring; sinks and the last
// block with the remainder score 1; a sequence shorter than n_sink + 2 lag scores by age.
#include "policy_reference_util.h"

namespace kv::test {
namespace {

// kvpress' _get_states_score of one block (rows x D each) against its reference block.
std::vector<double> states_score(const std::vector<std::vector<float>>& block, const std::vector<std::vector<float>>& ref) {
    const size_t D = block[0].size();
    std::vector<double> s;
    for (const auto& x : block) {
        std::vector<double> v;
        for (size_t d = 0; d < D; ++d) {
            double mn = INFINITY, mx = -INFINITY;
            for (const auto& y : ref) mn = std::min(mn, double(y[d])), mx = std::max(mx, double(y[d]));
            v.push_back((double(x[d]) - mn) / (mx - mn));
        }
        double mean = 0, var = 0;
        for (double e : v) mean += e / double(D);
        for (double e : v) var += (e - mean) * (e - mean);
        s.push_back(std::sqrt(var / double(D - 1)));
    }
    // softmax; shifted by the maximum, as torch's (a narrow reference range makes the stds large)
    const double top = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double e : s) z += std::exp(e - top);
    for (double& e : s) e = std::exp(e - top) / z;
    return s;
}

std::vector<double> lagkv_reference(const LayerHarness& h, int64_t sinks, int64_t lag, bool cross) {
    const int64_t L = h.L;
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const std::vector<int64_t> seq = ref_slots_by_position(h, r, [](int32_t p) { return p >= 0; });
        const int64_t m = int64_t(seq.size());
        for (int64_t i = 0; i < m; ++i) out[size_t(r * L + seq[size_t(i)])] = 1.0;
        if (m < sinks + 2 * lag) {
            for (int64_t i = sinks; i < m; ++i) out[size_t(r * L + seq[size_t(i)])] = double(i - sinks) / double(m - sinks);
            continue;
        }
        const int64_t end = sinks + (m - sinks) / lag * lag;
        for (int64_t b = sinks; b + lag < end; b += lag) {
            std::vector<double> mix((size_t)lag, 0.0);
            for (int half = 0; half < 2; ++half) {
                std::vector<std::vector<float>> blk, ref;
                for (int64_t i = b; i < b + 2 * lag; ++i) {
                    const auto& kv = h.history[size_t(r)].at(h.cache->layer(0).policy().token_positions()[size_t(r * L + seq[size_t(i)])]);
                    (i < b + lag ? blk : ref).push_back(half == 0 ? kv.first : kv.second);
                }
                const std::vector<double> s = states_score(blk, ref);
                for (int64_t t = 0; t < lag; ++t) mix[size_t(t)] += s[size_t(t)] / 2;
            }
            for (int64_t t = 0; t < lag; ++t) {
                // argsort().argsort(): how many of the block score lower; exact ties (a saturated
                // softmax: (1 + 0) / 2 = (0 + 1) / 2) rank the earlier token lower
                int64_t rank = 0;
                for (int64_t u = 0; u < lag; ++u) rank += mix[size_t(u)] < mix[size_t(t)] || (mix[size_t(u)] == mix[size_t(t)] && u < t);
                out[size_t(r * L + seq[size_t(b + t)])] = cross ? mix[size_t(t)] : double(rank) / double(lag);
            }
        }
    }
    return out;
}

TEST(LagKV, BlockScoresAndChoicesEqualTheF64Reference) {
    // 12 cached tokens: sink 1, blocks of 3 -> blocks at 1 and 4 scored, 7.. the reference and tail
    check_policy_against_reference(
        "lagkv-default", [](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 1}, {"lagkv_lag", 3}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 1, 3, false); });
    check_policy_against_reference(
        "lagkv-default", [](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 0}, {"lagkv_lag", 2}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 0, 2, false); });
}

TEST(LagKV, CrossScoringEqualsTheF64Reference) {
    check_policy_against_reference(
        "lagkv-default", [](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 2}, {"lagkv_lag", 2}, {"lagkv_cross", 1}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 2, 2, true); });
}

TEST(LagKV, ShortSequenceKeepsTheNewestAsKvpress) {
    // kvpress' defaults (4 sinks, blocks of 128) on 12 tokens: no block is scored, the newest stay
    check_policy_against_reference("lagkv-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 4, 128, false); });
}

}  // namespace
}  // namespace kv::test
