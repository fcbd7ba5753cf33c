// `--fidelity true` end to end: a sweep (dense + lastrec) records fidelity per (layer, chunk)
// as session metrics; the dense run's are 0 error and 1 kept mass exactly, every layer has one
// value per chunk, the run summary's means are the means of the stored values, and the sweep
// table can rank by them. The next-token KL: one row per chunk (fidelity.next_token_kl), 0
// exactly for dense, its summary mean the mean of the rows, in the metrics CSV export too.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/session_reader.h"

namespace kv {
namespace {

const std::string kExe = std::string(KVLAB_BINARY_DIR) + "/bin/kvlab";

TEST(FidelityCli, SweepRecordsPerLayerPerChunkFidelity) {
    ASSERT_TRUE(std::filesystem::exists(kExe)) << kExe;
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kvlab-fidelity-cli-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string session = (dir / "f.kvlab").string(), out = (dir / "table.csv").string();
    const std::string cmd = kExe + " sweep tiny --data passkey --data.seq_length 256 --data.num_samples 1 --kv_cache.name lastrec" +
                            " --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --fidelity true --metric fidelity_kept_mass" +
                            " --format csv --figure none --session " + session + " >" + out + " 2>/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

    storage::SessionReader rd(session);
    const auto runs = rd.runs();
    ASSERT_EQ(runs.size(), 2u);
    std::map<std::string, double> kept_mean;
    for (const auto& r : runs) {
        SCOPED_TRACE(r.name);
        const nlohmann::json s = nlohmann::json::parse(r.summary);
        ASSERT_TRUE(s.contains("fidelity_kept_mass")) << r.summary;
        const bool dense = r.name.rfind("dense", 0) == 0;
        // The chunk plan: lastrec prefills its 64 slots, then 16-token chunks (13 chunks); the
        // sweep's dense reference steps in the same chunks (its prefill is the smallest cache).
        const int64_t chunks = 1 + (256 - 64) / 16;
        EXPECT_EQ(s["chunks_per_sample"].get<int64_t>(), chunks);
        int layers = 0;
        double sum_mass = 0, sum_err = 0, n = 0, min_mass = 1;
        for (int l = 0;; ++l) {
            const auto mass = rd.metrics(r.id, "fidelity.kept_mass.layer" + std::to_string(l));
            const auto err = rd.metrics(r.id, "fidelity.attn_rel_error.layer" + std::to_string(l));
            if (mass.empty()) break;
            ++layers;
            ASSERT_EQ(int64_t(mass.size()), chunks) << "layer " << l;
            ASSERT_EQ(int64_t(err.size()), chunks) << "layer " << l;
            std::vector<bool> seen(size_t(chunks), false);
            for (size_t i = 0; i < mass.size(); ++i) {
                ASSERT_GE(mass[i].step, 0);
                ASSERT_LT(mass[i].step, chunks);
                seen[size_t(mass[i].step)] = true;
                if (dense) {
                    EXPECT_EQ(mass[i].value, 1.0);
                    EXPECT_EQ(err[i].value, 0.0);
                }
                EXPECT_GE(err[i].value, 0.0);
                EXPECT_LE(mass[i].value, 1.0 + 1e-12);
                sum_mass += mass[i].value;
                sum_err += err[i].value;
                min_mass = std::min(min_mass, mass[i].value);
                n += 1;
            }
            for (int64_t c = 0; c < chunks; ++c) EXPECT_TRUE(seen[size_t(c)]) << "layer " << l << " has no chunk " << c;
        }
        EXPECT_GE(layers, 1);
        ASSERT_TRUE(s.contains("fidelity_layers") && s["fidelity_layers"].size() == size_t(layers)) << r.summary;
        EXPECT_NEAR(s["fidelity_kept_mass"].get<double>(), sum_mass / n, 1e-12);
        EXPECT_NEAR(s["fidelity_attn_rel_error"].get<double>(), sum_err / n, 1e-12);
        if (!dense) {
            EXPECT_LT(min_mass, 1.0) << "64 of 256 tokens kept must lose attention mass somewhere";
        }
        kept_mean[dense ? "dense" : "lastrec"] = s["fidelity_kept_mass"].get<double>();
        const auto kl = rd.metrics(r.id, "fidelity.next_token_kl");
        ASSERT_EQ(int64_t(kl.size()), chunks);
        double kl_sum = 0, kl_max = 0;
        for (const auto& k : kl) {
            EXPECT_GE(k.value, 0.0);
            if (dense) {
                EXPECT_EQ(k.value, 0.0) << "chunk " << k.step;
            }
            kl_sum += k.value;
            kl_max = std::max(kl_max, k.value);
        }
        ASSERT_TRUE(s.contains("fidelity_next_token_kl")) << r.summary;
        EXPECT_NEAR(s["fidelity_next_token_kl"].get<double>(), kl_sum / double(chunks), 1e-12);
        if (!dense) {
            EXPECT_GT(kl_max, 0.0) << "64 of 256 tokens kept must change some next-token distribution";
            // The metrics CSV export carries the same rows.
            const std::string csv = (dir / "metrics.csv").string();
            const std::string ex = kExe + " export " + session + " --run " + std::to_string(r.id) + " --what metrics --format csv -o " + csv +
                                   " >/dev/null 2>&1";
            ASSERT_EQ(std::system(ex.c_str()), 0) << ex;
            std::ifstream mc(csv);
            std::string row;
            int kl_rows = 0;
            while (std::getline(mc, row)) kl_rows += row.find("fidelity.next_token_kl") != std::string::npos;
            EXPECT_EQ(kl_rows, chunks);
        }
    }

    // The table ranks by the same numbers.
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string table = ss.str();
    EXPECT_NE(table.find("fidelity_kept_mass"), std::string::npos) << table;
    std::istringstream lines(table);
    std::string line;
    int rows = 0;
    while (std::getline(lines, line)) {
        if (line.rfind("dense", 0) == 0 || line.rfind("lastrec", 0) == 0) {
            ++rows;
            const double want = kept_mean[line.rfind("dense", 0) == 0 ? "dense" : "lastrec"];
            bool found = false;
            std::istringstream f(line);
            std::string cell;
            while (std::getline(f, cell, ','))
                if (!cell.empty() && (std::isdigit((unsigned char)cell[0]) || cell[0] == '-'))
                    found = found || std::abs(std::strtod(cell.c_str(), nullptr) - want) <= 1e-5 * std::max(1.0, std::abs(want));
            EXPECT_TRUE(found) << "row '" << line << "' lacks its run's mean " << want;
        }
    }
    EXPECT_EQ(rows, 2) << table;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

// The oracle (--fidelity_oracle, on by default): per layer and chunk the oracle's mass is at least
// the policy's and the efficiency their ratio, the summary's means are the rows' means, and
// `kvlab plot --x layer` draws the per-layer efficiency (and refuses a metric without layers).
TEST(FidelityCli, OracleEfficiencyIsRecordedAndPlottedPerLayer) {
    ASSERT_TRUE(std::filesystem::exists(kExe)) << kExe;
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("kvlab-oracle-cli-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string session = (dir / "o.kvlab").string();
    const std::string cmd = kExe + " sweep tiny --data passkey --data.seq_length 256 --data.num_samples 1 --kv_cache.name h2o" +
                            " --kv_cache.cache_length 64 --kv_cache.chunk_size 16 --fidelity true --figure none --session " + session +
                            " >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    storage::SessionReader rd(session);
    int policies = 0;
    for (const auto& r : rd.runs()) {
        SCOPED_TRACE(r.name);
        const nlohmann::json s = nlohmann::json::parse(r.summary);
        ASSERT_TRUE(s.contains("fidelity_efficiency") && s.contains("fidelity_oracle_mass")) << r.summary;
        double sum_eff = 0, sum_oracle = 0, n = 0, min_eff = 1;
        for (int l = 0;; ++l) {
            const auto kept = rd.metrics(r.id, "fidelity.kept_mass.layer" + std::to_string(l));
            const auto oracle = rd.metrics(r.id, "fidelity.oracle_mass.layer" + std::to_string(l));
            const auto eff = rd.metrics(r.id, "fidelity.efficiency.layer" + std::to_string(l));
            if (kept.empty()) break;
            ASSERT_EQ(oracle.size(), kept.size());
            ASSERT_EQ(eff.size(), kept.size());
            double layer_eff = 0;
            for (size_t i = 0; i < kept.size(); ++i) {
                ASSERT_EQ(oracle[i].step, kept[i].step);
                EXPECT_GE(oracle[i].value, kept[i].value) << "layer " << l << " step " << kept[i].step;
                EXPECT_NEAR(eff[i].value, kept[i].value / oracle[i].value, 1e-12);
                sum_eff += eff[i].value, sum_oracle += oracle[i].value, n += 1, layer_eff += eff[i].value;
                min_eff = std::min(min_eff, eff[i].value);
            }
            EXPECT_NEAR(s["fidelity_layers"][size_t(l)]["efficiency"].get<double>(), layer_eff / double(kept.size()), 1e-12);
        }
        ASSERT_GT(n, 0);
        EXPECT_NEAR(s["fidelity_efficiency"].get<double>(), sum_eff / n, 1e-12);
        EXPECT_NEAR(s["fidelity_oracle_mass"].get<double>(), sum_oracle / n, 1e-12);
        if (r.name.rfind("dense", 0) == 0) {
            EXPECT_EQ(min_eff, 1.0);
        } else {
            ++policies;
            EXPECT_LT(min_eff, 1.0) << "h2o keeping 64 of 256 misses the best set somewhere";
        }
    }
    EXPECT_EQ(policies, 1);
    const std::string svg = (dir / "eff.svg").string();
    const std::string plot = kExe + " plot " + session + " --x layer --y fidelity_efficiency -o " + svg + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(plot.c_str()), 0) << plot;
    EXPECT_GT(std::filesystem::file_size(svg), 1000u);
    const std::string err = (dir / "bad.err").string();
    const std::string bad = kExe + " plot " + session + " --x layer --y mean_loss -o " + (dir / "bad.svg").string() + " >" + err + " 2>&1";
    EXPECT_NE(std::system(bad.c_str()), 0) << bad;
    std::ifstream in(err);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_NE(ss.str().find("--x layer: 'mean_loss' has no per-layer values; expected --y one of"), std::string::npos) << ss.str();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kv
