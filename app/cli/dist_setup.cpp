// Installing the process communicator for a command (see dist_setup.h).
#include "dist_setup.h"

#include <cstdlib>

#include "cli_args.h"
#include "engine/core/error.h"
#include "engine/dist/communicator.h"

namespace kv::cli {

DistSetup setup_dist(RunConfig& cfg, const std::string& command, bool splits_work) {
    DistSetup d;
    if (dist::Communicator* c = dist::process_communicator()) {
        d = {true, c->rank(), c->size(), c->backend()};
        cfg.dist.ranks = d.ranks;
        return d;
    }
    const bool asked = cfg.dist.backend == "mpi" || cfg.dist.backend == "nccl";
    if (!asked && !(cfg.dist.backend == "auto" && dist::launched_by_mpirun())) {
        cfg.dist.ranks = 1;
        return d;  // one process: nothing changes
    }
    if (!splits_work) {
        const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
        if (asked || (n && std::atoi(n) > 1))
            throw UsageError(str(command, " does not split its work over ranks (", n ? n : "?",
                                 " under mpirun); data parallelism is for finetune_*, sweep and bench dist; run it as one process"));
        cfg.dist.ranks = 1;
        return d;
    }
    dist::DistOptions o;
    o.backend = cfg.dist.backend;
    o.timeout_s = cfg.dist.timeout;
    std::unique_ptr<dist::Communicator> c;
    try {
        c = dist::make_communicator(o);
    } catch (const dist::DistError&) {
        throw;
    } catch (const Error& e) {
        throw UsageError(e.what() + (e.hint().empty() ? std::string() : std::string("\n  hint: ") + e.hint()));
    }
    d = {true, c->rank(), c->size(), c->backend()};
    dist::install_process_communicator(std::move(c));
    cfg.dist.ranks = d.ranks;
    return d;
}

}  // namespace kv::cli
