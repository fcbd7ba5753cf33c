// Per-rank telemetry into the run's session (see rank_telemetry.h).
#include "rank_telemetry.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include "engine/core/error.h"
#include "engine/dist/communicator.h"
#include "engine/dist/gather_bytes.h"
#include "storage/rank_runs.h"
#include "storage/session.h"

namespace kv::cli {

void share_rank_telemetry(const DistSetup& ds, const std::string& path, int64_t run, storage::RunStatus status) {
    dist::Communicator* comm = dist::process_communicator();
    if (!comm || ds.ranks < 2) return;
    // A failed run means a failed collective (or a rank that will never arrive): nothing to
    // meet for; rank 0's session already holds its own records.
    if (comm->broken() || status == storage::RunStatus::FAILED) {
        if (ds.rank == 0)
            std::fprintf(stderr, "kvlab: the run failed; the other ranks' telemetry is not in the session (rank 0's is)\n");
        return;
    }
    std::vector<uint8_t> mine;
    if (ds.rank != 0) {
        try {
            // Everything in the main file (a WAL left behind would not travel with it).
            storage::Session::open(path)->checkpoint();
        } catch (const std::exception&) {
            // sent as it is: rank 0 says what it could not import
        }
        std::ifstream f(path, std::ios::binary);
        mine.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    std::vector<dist::RankBytes> all;
    try {
        all = dist::gather_bytes_to_root(*comm, uint64_t(run), mine, "rank telemetry");
    } catch (const std::exception& e) {
        if (ds.rank == 0) std::fprintf(stderr, "kvlab: the other ranks' telemetry did not arrive (%s); rank 0's is in the session\n", e.what());
        return;
    }
    if (ds.rank != 0) return;
    namespace fs = std::filesystem;
    for (int r = 1; r < int(all.size()); ++r) {
        if (all[size_t(r)].bytes.empty()) {
            std::fprintf(stderr, "kvlab: rank %d sent no telemetry\n", r);
            continue;
        }
        const fs::path tmp = fs::temp_directory_path() / str("kvlab-import-rank", r, "-", getpid(), ".kvlab");
        std::error_code ec;
        try {
            {
                std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
                out.write(reinterpret_cast<const char*>(all[size_t(r)].bytes.data()), std::streamsize(all[size_t(r)].bytes.size()));
                if (!out) throw Error(str("could not write ", tmp.string()));
            }
            const storage::RankImport imp = storage::import_rank_run(path, run, r, tmp.string(), int64_t(all[size_t(r)].tag));
            std::fprintf(stderr, "kvlab: rank %d's telemetry is run %lld of the session (%lld spans, %lld memory events)\n", r,
                         (long long)imp.run, (long long)imp.spans, (long long)imp.memory_events);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "kvlab: rank %d's telemetry could not be imported: %s\n", r, e.what());
        }
        for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(tmp.string() + suffix, ec);
    }
}

}  // namespace kv::cli
