// `kvlab sweep` and `kvlab plot` as a user runs them: a sweep killed with SIGKILL mid-way and
// run again finishes the grid without running a finished cell twice and prints the same table
// as an uninterrupted sweep; the table's numbers are the session's; the figure's polylines are
// the session's values under one affine (log2 x) mapping.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "engine/run/run_config.h"
#include "storage/session_reader.h"

extern char** environ;

namespace kv {
namespace {

using storage::RunStatus;

struct Dir {
    std::string dir;
    Dir() {
        std::string t = (std::filesystem::temp_directory_path() / "kvlab-sweep-cli-XXXXXX").string();
        std::vector<char> b(t.begin(), t.end());
        b.push_back(0);
        if (!mkdtemp(b.data())) throw std::runtime_error("mkdtemp failed");
        dir = b.data();
    }
    ~Dir() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    std::string file(const std::string& n) const { return dir + "/" + n; }
};

const std::string kExe = std::string(KVLAB_BINARY_DIR) + "/bin/kvlab";

// 1 reference + 3 policies x 3 lengths = 10 cells of a few tenths of a second each.
std::vector<std::string> sweep_args(const std::string& session) {
    return {kExe, "sweep", "tiny", "--data", "passkey", "--data.seq_length", "1024", "--data.num_samples", "1",
            "--kv_cache.name", "h2o,lastrec,tova", "--kv_cache.cache_length", "32,64,128", "--kv_cache.chunk_size", "16",
            "--telemetry.enabled", "false", "--metric", "mean_loss", "--format", "csv", "--session", session};
}

pid_t spawn(std::vector<std::string> args, const std::string& out_file) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, kExe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("posix_spawn failed");
    return pid;
}

int run_to_end(const std::vector<std::string>& args, const std::string& out_file) {
    const pid_t pid = spawn(args, out_file);
    int ws = 0;
    waitpid(pid, &ws, 0);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

std::string slurp(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::vector<std::string>> csv(const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        std::vector<std::string> f(1);
        for (char c : line)
            if (c == ',') f.emplace_back();
            else f.back() += c;
        rows.push_back(f);
    }
    return rows;
}

// The table without its run-id column (ids differ between sessions).
std::vector<std::vector<std::string>> without_run_ids(std::vector<std::vector<std::string>> rows) {
    size_t col = 0;
    while (col < rows[0].size() && rows[0][col] != "run") ++col;
    for (auto& r : rows) r.erase(r.begin() + long(col));
    return rows;
}

TEST(SweepCli, KilledSweepResumesWithoutRerunningCellsAndEndsWithTheSameTable) {
    ASSERT_TRUE(std::filesystem::exists(kExe)) << kExe;
    Dir d;
    // An uninterrupted sweep.
    const std::string a = d.file("a.kvlab");
    ASSERT_EQ(run_to_end(sweep_args(a), d.file("a.csv")), 0);
    const auto table_a = csv(slurp(d.file("a.csv")));
    ASSERT_EQ(table_a.size(), 1u + 10u) << slurp(d.file("a.csv"));

    // The same sweep, killed once two cells are done.
    const std::string b = d.file("b.kvlab");
    const pid_t pid = spawn(sweep_args(b), d.file("b0.csv"));
    std::map<int64_t, int64_t> done_at_kill;  // run id -> finished_ms
    for (int i = 0; i < 3000 && done_at_kill.size() < 2; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (!std::filesystem::exists(b)) continue;
        try {
            storage::SessionReader rd(b);
            done_at_kill.clear();
            for (const auto& r : rd.runs())
                if (r.status == RunStatus::DONE) done_at_kill[r.id] = r.finished_ms;
        } catch (const std::exception&) {
        }
    }
    kill(pid, SIGKILL);
    int ws = 0;
    waitpid(pid, &ws, 0);
    ASSERT_TRUE(WIFSIGNALED(ws)) << "the sweep ended before it was killed; make its cells longer";
    ASSERT_GE(done_at_kill.size(), 2u);
    ASSERT_LT(done_at_kill.size(), 10u);

    // Resumed: it runs only what is missing.
    ASSERT_EQ(run_to_end(sweep_args(b), d.file("b.csv")), 0);
    const auto table_b = csv(slurp(d.file("b.csv")));
    EXPECT_EQ(without_run_ids(table_b), without_run_ids(table_a));

    storage::SessionReader rd(b);
    std::map<std::string, int> done_per_name;
    for (const auto& r : rd.runs()) {
        if (r.status == RunStatus::DONE) ++done_per_name[r.name];
        if (done_at_kill.count(r.id)) {
            EXPECT_EQ(r.finished_ms, done_at_kill[r.id]) << "run " << r.id << " ran again";
        }
    }
    EXPECT_EQ(done_per_name.size(), 10u);
    for (const auto& [name, n] : done_per_name) EXPECT_EQ(n, 1) << name << " finished " << n << " times";
    // the finished runs from before the kill are the table's runs for their cells
    size_t run_col = 0;
    while (table_b[0][run_col] != "run") ++run_col;
    std::set<int64_t> table_runs;
    for (size_t i = 1; i < table_b.size(); ++i) table_runs.insert(std::stoll(table_b[i][run_col]));
    for (const auto& [id, t] : done_at_kill) EXPECT_TRUE(table_runs.count(id)) << "run " << id;

    // Table contents against the runs: metric = the run's summary, delta = minus the dense run's.
    size_t metric_col = run_col + 1;
    ASSERT_EQ(table_b[0][metric_col], "mean_loss");
    double dense = NAN;
    for (size_t i = 1; i < table_b.size(); ++i)
        if (table_b[i][0] == "dense-default") dense = nlohmann::json::parse(rd.run(std::stoll(table_b[i][run_col])).summary)["mean_loss"];
    ASSERT_TRUE(std::isfinite(dense));
    for (size_t i = 1; i < table_b.size(); ++i) {
        const auto info = rd.run(std::stoll(table_b[i][run_col]));
        const RunConfig cfg = run_config_from_json(info.config, "run");
        EXPECT_EQ(table_b[i][0], cfg.kv_cache.name);
        if (cfg.kv_cache.name != "dense-default") {
            EXPECT_EQ(table_b[i][1], std::to_string(cfg.kv_cache.cache_length));
        }
        const double v = nlohmann::json::parse(info.summary)["mean_loss"];
        EXPECT_NEAR(std::stod(table_b[i][metric_col]), v, 1e-5 * std::fabs(v));
        EXPECT_NEAR(std::stod(table_b[i][metric_col + 1]), v - dense, 1e-3);
    }

    // The default figure was written next to the session, and `kvlab plot` draws the runs.
    EXPECT_TRUE(std::filesystem::exists(d.file("b.svg")));
    const std::string svg = d.file("fig.svg");
    ASSERT_EQ(run_to_end({kExe, "plot", b, "--x", "kv_cache.cache_length", "--y", "mean_loss", "--by", "kv_cache.name", "-o", svg},
                         d.file("plot.out")),
              0);
    // Polylines: paths of straight segments ("M x y L x y ..."); cairo writes each series as one.
    const std::string text = slurp(svg);
    std::regex path_re(R"re(<path[^>]*d="([^"]*)")re");
    std::vector<std::vector<std::pair<double, double>>> lines;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path_re); it != std::sregex_iterator(); ++it) {
        const std::string dstr = (*it)[1];
        if (dstr.find_first_of("CcZzQqAaHhVv") != std::string::npos) continue;  // markers, frames
        std::istringstream in(dstr);
        std::string cmd;
        std::vector<std::pair<double, double>> pts;
        bool single = true;
        while (in >> cmd) {
            double x, y;
            in >> x >> y;
            if (cmd == "M" && !pts.empty()) single = false;  // several sub-paths: grid lines
            pts.push_back({x, y});
        }
        if (single) lines.push_back(pts);
    }
    // Expected: per policy, mean_loss at L = 64, 128; dense as a level.
    std::map<std::string, std::map<int64_t, double>> want;
    for (const auto& r : rd.runs()) {
        if (r.status != RunStatus::DONE) continue;
        const RunConfig cfg = run_config_from_json(r.config, "run");
        const double v = nlohmann::json::parse(r.summary)["mean_loss"];
        if (cfg.kv_cache.name == "dense-default") dense = v;
        else want[cfg.kv_cache.name][cfg.kv_cache.cache_length] = v;
    }
    // Series are 3-point polylines (L = 32, 64, 128) sharing their x positions; the legend
    // samples and the dense level are 2-point lines.
    std::vector<std::vector<std::pair<double, double>>> series;
    for (const auto& l : lines)
        if (l.size() == 3) series.push_back(l);
    ASSERT_EQ(series.size(), want.size()) << "expected one polyline per policy";
    const double x0 = series[0][0].first, x1 = series[0][1].first, x2 = series[0][2].first;
    for (const auto& sr : series) {
        EXPECT_NEAR(sr[0].first, x0, 1e-6);
        EXPECT_NEAR(sr[1].first, x1, 1e-6);
        EXPECT_NEAR(sr[2].first, x2, 1e-6);
    }
    // log2 axis: 32 -> 64 -> 128 are equal steps, left to right
    EXPECT_GT(x1 - x0, 1);
    EXPECT_NEAR(x2 - x1, x1 - x0, 1e-6);
    // y: an affine map growing upwards sends the smallest value to the largest page y.
    double vmin = 1e300, vmax = -1e300, pmin = 1e300, pmax = -1e300;
    for (const auto& [name, m] : want)
        for (const auto& [L, v] : m) vmin = std::min(vmin, v), vmax = std::max(vmax, v);
    for (const auto& sr : series)
        for (const auto& p : sr) pmin = std::min(pmin, p.second), pmax = std::max(pmax, p.second);
    ASSERT_GT(vmax, vmin) << "the tiny model gave every cell the same loss; the figure cannot be checked";
    const double c = (pmin - pmax) / (vmax - vmin), e = pmin - c * vmax;
    size_t matched = 0;
    for (const auto& [name, m] : want) {
        ASSERT_EQ(m.size(), 3u) << name;
        bool found = false;
        for (const auto& sr : series) {
            bool all = true;
            size_t k = 0;
            for (const auto& [L, v] : m) all = all && std::fabs(sr[k++].second - (c * v + e)) < 0.01;
            found = found || all;
        }
        EXPECT_TRUE(found) << name << ": no polyline through its three values";
        matched += found;
    }
    EXPECT_EQ(matched, want.size());
    // the dense level: a horizontal line at c * dense + e spanning the panel
    bool level = false;
    for (const auto& l : lines)
        if (l.size() == 2 && std::fabs(l[0].second - l[1].second) < 1e-6 && std::fabs(l[0].second - (c * dense + e)) < 0.01 &&
            l[0].first < x0 && l[1].first > x2)
            level = true;
    EXPECT_TRUE(level) << "no dense reference line at y " << c * dense + e;
}

TEST(SweepCli, BadInputGetsOneClearMessage) {
    Dir d;
    std::vector<std::string> args = {kExe, "sweep", "tiny", "--kv_cache.name", "h2o,lastrec", "--kv_cache.cache_length", "8,64",
                                     "--kv_cache.chunk_size", "16", "--session", d.file("x.kvlab")};
    const pid_t pid = spawn(args, d.file("o"));
    int ws = 0;
    waitpid(pid, &ws, 0);
    EXPECT_EQ(WEXITSTATUS(ws), 2);
    EXPECT_FALSE(std::filesystem::exists(d.file("x.kvlab"))) << "a bad grid must fail before creating the session";
}

}  // namespace
}  // namespace kv
