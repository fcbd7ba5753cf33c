// Distributed sweeps (see sweep_dist.h).
#include "sweep_dist.h"

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/dist/communicator.h"
#include "storage/session.h"

namespace kv::cli {

namespace {
dist::Communicator& comm() {
    dist::Communicator* c = dist::process_communicator();
    if (!c) throw Error("distributed sweep without a communicator");
    return *c;
}

// Variable-length bytes from `root` to every rank.
std::string broadcast_text(const std::string& text, int root) {
    uint64_t n = text.size();
    comm().broadcast(&n, sizeof n, root, "sweep result size");
    std::string out = comm().rank() == root ? text : std::string(size_t(n), '\0');
    if (n) comm().broadcast(out.data(), size_t(n), root, "sweep results");
    return out;
}
}  // namespace

std::string rank_session_path(const std::string& path, int rank) {
    std::string stem = path;
    if (stem.size() > 6 && stem.compare(stem.size() - 6, 6, ".kvlab") == 0) stem.resize(stem.size() - 6);
    return str(stem, ".rank", rank, ".kvlab");
}

std::vector<size_t> share_pending_cells(const std::vector<size_t>& pending_on_rank0, const DistSetup& ds) {
    nlohmann::json j = pending_on_rank0;
    const nlohmann::json all = nlohmann::json::parse(broadcast_text(ds.rank == 0 ? j.dump() : std::string(), 0));
    std::vector<size_t> mine;
    for (size_t k = 0; k < all.size(); ++k)
        if (int(k % size_t(ds.ranks)) == ds.rank) mine.push_back(all[k].get<size_t>());
    return mine;
}

int gather_sweep_runs(const std::vector<sessions::SweepCell>& cells, const std::map<size_t, int64_t>& mine, storage::Session& own,
                      const std::string& own_path, const DistSetup& ds) {
    int failures = 0;
    for (int r = 1; r < ds.ranks; ++r) {
        std::string text;
        if (ds.rank == r) {
            nlohmann::json a = nlohmann::json::array();
            for (const auto& [cell, id] : mine) {
                const storage::RunInfo info = own.run(id);
                a.push_back({{"cell", cell},
                             {"status", storage::run_status_name(info.status)},
                             {"summary", info.summary.empty() ? "{}" : info.summary},
                             {"error", info.error},
                             {"host", comm().host()},
                             {"session", own_path},
                             {"run", id}});
            }
            text = a.dump();
        }
        text = broadcast_text(text, r);
        if (ds.rank != 0) continue;
        for (const auto& x : nlohmann::json::parse(text)) {
            const size_t cell = x["cell"].get<size_t>();
            if (cell >= cells.size()) throw Error(str("sweep: rank ", r, " reported cell ", cell, " of ", cells.size()));
            const RunConfig& cfg = cells[cell].cfg;
            const std::string name = cfg.name.empty() ? str(cfg.mode, " ", cfg.model, " ", cfg.kv_cache.name,
                                                            cfg.kv_cache.cache_length ? str(" L=", cfg.kv_cache.cache_length) : "")
                                                      : cfg.name;
            const std::string status = x["status"].get<std::string>();
            storage::RunStatus st = storage::RunStatus::FAILED;
            for (auto s : {storage::RunStatus::DONE, storage::RunStatus::DEGRADED, storage::RunStatus::CANCELLED, storage::RunStatus::FAILED})
                if (status == storage::run_status_name(s)) st = s;
            storage::Session& target = own;  // on rank 0 its own session is the target
            const int64_t run = target.create_run(name, run_config_to_json(cfg, false));
            nlohmann::json build = {{"dist", {{"rank", r}, {"host", x["host"]}}}};
            target.start_run(run, build.dump());
            nlohmann::json summary = nlohmann::json::parse(x["summary"].get<std::string>(), nullptr, false);
            if (!summary.is_object()) summary = nlohmann::json::object();
            summary["dist"] = {{"rank", r}, {"host", x["host"]}, {"session", x["session"]}, {"run", x["run"]}};
            target.merge_summary(run, summary.dump());
            target.finish_run(run, st, x["error"].get<std::string>());
            if (st == storage::RunStatus::FAILED) ++failures;
        }
    }
    return failures;
}

}  // namespace kv::cli
