// The needle heat map of `kvlab plot --heatmap needle` (app/cli/plot_commands.h): from a real
// sweep of the needle task over two lengths and three depths, each cell is the mean of the
// sample_correct rows of the samples at that depth (sample i at depths[i % 3], the rule the
// evaluation follows), worked out here from the stored rows; a session without such runs is
// refused with what to run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "app/cli/plot_commands.h"
#include "engine/core/error.h"
#include "storage/session_reader.h"

namespace kv {
namespace {

TEST(NeedleHeatmap, CellsAreTheMeanOfTheSamplesAtEachDepthAndLength) {
    const std::string exe = std::string(KVLAB_BINARY_DIR) + "/bin/kvlab";
    ASSERT_TRUE(std::filesystem::exists(exe)) << exe;
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kvlab-needle-map-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string session = (dir / "n.kvlab").string();
    const std::string cmd = exe + " sweep tiny --data needle --data.depths 0,0.5,1 --data.num_samples 6 --data.seq_length 256,384" +
                            " --kv_cache.name lastrec --kv_cache.cache_length 128 --figure none --session " + session + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const plot::Heatmap h = cli::needle_heatmap(session, {}, "kv_cache.name");
    EXPECT_EQ(h.x_labels, (std::vector<std::string>{"256", "384"}));
    EXPECT_EQ(h.y_labels, (std::vector<std::string>{"0", "0.5", "1"}));
    ASSERT_EQ(h.panels.size(), 2u);  // dense and lastrec
    storage::SessionReader rd(session);
    int checked = 0;
    for (const auto& r : rd.runs()) {
        const bool dense = r.name.rfind("dense", 0) == 0;
        const plot::HeatmapPanel& p = h.panels[dense ? 0 : 1];
        EXPECT_EQ(p.title, dense ? "dense-default" : "lastrec-default");
        const int col = r.config.find("\"seq_length\":256") != std::string::npos ? 0 : 1;
        const auto rows = rd.metrics(r.id, "sample_correct");
        ASSERT_EQ(rows.size(), 6u);
        for (int d = 0; d < 3; ++d) {
            // samples d and d + 3 sit at depth index d
            double sum = 0;
            for (const auto& m : rows)
                if (m.step % 3 == d) sum += m.value;
            EXPECT_DOUBLE_EQ(p.values[size_t(d)][size_t(col)], sum / 2) << r.name << " depth " << d;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 4 * 3);
    // A heat map file is written; a session without needle runs says what to run.
    const std::string svg = (dir / "map.svg").string();
    plot::render_heatmap(h, svg);
    EXPECT_GT(std::filesystem::file_size(svg), 1000u);
    const std::string other = (dir / "o.kvlab").string();
    ASSERT_EQ(std::system((exe + " eval_long tiny --data passkey --data.seq_length 256 --data.num_samples 1 --session " + other +
                           " >/dev/null 2>&1").c_str()),
              0);
    try {
        cli::needle_heatmap(other, {}, "kv_cache.name");
        FAIL() << "no run with --data.depths";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("with --data.depths"), std::string::npos) << e.what();
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

// RULER's one-needle task under compress-then-ask (--data.depths places its needle): each
// sample's exact answer is recorded as sample_correct, and the map reads those runs too.
TEST(NeedleHeatmap, RulerNeedlesCompressedOnceAreMapped) {
    const std::string exe = std::string(KVLAB_BINARY_DIR) + "/bin/kvlab";
    ASSERT_TRUE(std::filesystem::exists(exe)) << exe;
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kvlab-ruler-map-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string session = (dir / "r.kvlab").string();
    const std::string cmd = exe + " sweep tiny --protocol compress-then-ask --data niah_single --data.depths 0,1 --data.num_samples 4" +
                            " --data.seq_length 512 --kv_cache.name snapkv --kv_cache.compression_ratio 0.5 --figure none --session " +
                            session + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const plot::Heatmap h = cli::needle_heatmap(session, {}, "kv_cache.name");
    EXPECT_EQ(h.x_labels, (std::vector<std::string>{"512"}));
    EXPECT_EQ(h.y_labels, (std::vector<std::string>{"0", "1"}));
    ASSERT_EQ(h.panels.size(), 2u);  // dense and snapkv
    storage::SessionReader rd(session);
    int checked = 0;
    for (const auto& r : rd.runs()) {
        const bool dense = r.name.rfind("dense", 0) == 0;
        const auto rows = rd.metrics(r.id, "sample_correct");
        ASSERT_EQ(rows.size(), 4u) << r.name;
        for (int d = 0; d < 2; ++d) {
            double sum = 0;
            for (const auto& m : rows)
                if (m.step % 2 == d) sum += m.value;
            EXPECT_DOUBLE_EQ(h.panels[dense ? 0 : 1].values[size_t(d)][0], sum / 2) << r.name << " depth " << d;
            ++checked;
        }
    }
    EXPECT_EQ(checked, 2 * 2);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kv
