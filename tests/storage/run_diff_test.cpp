// Run diff sections that the recorded CPU runs of span_summary_test.cpp leave empty: GPU
// kernels, memcpys and memsets (time and count per name and kind) against plain sums over
// random activity rows, and chunk memory peaks against a scan.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "storage/run_diff.h"

namespace kv {
namespace {

using storage::GpuActivityRow;

std::vector<GpuActivityRow> random_gpu(std::mt19937& rng, int n) {
    const char* names[] = {"gemv_q8", "sdpa", "rmsnorm", "memcpy HtoD", "memset"};
    std::vector<GpuActivityRow> out;
    int64_t t = 1000;
    for (int i = 0; i < n; ++i) {
        GpuActivityRow g;
        const int k = int(rng() % 5);
        g.kind = k == 3 ? GpuActivityRow::MEMCPY : k == 4 ? GpuActivityRow::MEMSET : GpuActivityRow::KERNEL;
        g.name = names[k];
        g.start_ns = t;
        g.end_ns = t + 1 + int64_t(rng() % 5000);
        t = g.end_ns + int64_t(rng() % 300);
        out.push_back(g);
    }
    return out;
}

TEST(RunDiff, KernelsAreTheDifferenceOfPlainSums) {
    std::mt19937 rng(3);
    storage::RunDiffInput a, b;
    a.gpu = random_gpu(rng, 400);
    b.gpu = random_gpu(rng, 250);
    // A name only B has: A counts 0 of it.
    GpuActivityRow extra;
    extra.name = "only_in_b";
    extra.start_ns = 5, extra.end_ns = 905;
    b.gpu.push_back(extra);
    auto sums = [](const std::vector<GpuActivityRow>& v) {
        std::map<std::string, std::pair<int64_t, int64_t>> out;
        for (const auto& g : v) {
            auto& s = out[g.name];
            ++s.first;
            s.second += g.end_ns - g.start_ns;
        }
        return out;
    };
    const auto sa = sums(a.gpu), sb = sums(b.gpu);
    const storage::RunDiff d = storage::run_diff(a, b);
    size_t kernels = 0;
    double last = INFINITY;
    for (const auto& r : d.rows) {
        if (r.section != "kernels") continue;
        ++kernels;
        const auto za = sa.count(r.name) ? sa.at(r.name) : std::pair<int64_t, int64_t>{0, 0};
        const auto zb = sb.count(r.name) ? sb.at(r.name) : std::pair<int64_t, int64_t>{0, 0};
        EXPECT_EQ(r.count_a, za.first) << r.name;
        EXPECT_EQ(r.count_b, zb.first) << r.name;
        EXPECT_NEAR(r.a, double(za.second) / 1e6, 1e-9) << r.name;
        EXPECT_NEAR(r.b, double(zb.second) / 1e6, 1e-9) << r.name;
        EXPECT_EQ(r.detail, r.name == "memcpy HtoD" ? "memcpy" : r.name == "memset" ? "memset" : "kernel");
        EXPECT_LE(std::fabs(r.b_minus_a()), last) << "kernels by |B - A|";
        last = std::fabs(r.b_minus_a());
    }
    EXPECT_EQ(kernels, 6u);
    // Against itself: every kernel row is zero.
    for (const auto& r : storage::run_diff(a, a).rows)
        if (r.section == "kernels") {
            EXPECT_EQ(r.b_minus_a(), 0.0) << r.name;
        }
}

TEST(RunDiff, ChunkPeaksAreTheLargestCategoryTotalPerChunk) {
    std::mt19937 rng(9);
    std::vector<storage::MemoryEventRow> ev;
    std::map<std::tuple<int, int, int>, int64_t> want;
    for (int i = 0; i < 2000; ++i) {
        storage::MemoryEventRow e;
        e.device = int(rng() % 2) - 1;
        e.category = MemCategory(rng() % 3);
        e.chunk = int(rng() % 7) - 1;  // -1: untagged, left out
        e.category_total = int64_t(rng() % 100000);
        ev.push_back(e);
        if (e.chunk >= 0) {
            int64_t& w = want[{e.device, int(e.category), e.chunk}];
            w = std::max(w, e.category_total);
        }
    }
    const auto got = storage::chunk_memory_peaks(ev);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& c : got) EXPECT_EQ(c.peak_bytes, want.at({c.device, int(c.category), c.chunk}));
}

}  // namespace
}  // namespace kv
