// The none backend, backend selection and the process communicator (see communicator.h).
#include "communicator.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "backends.h"

namespace kv::dist {

size_t reduce_type_size(ReduceType t) { return t == ReduceType::F32 ? 4 : 8; }

namespace {

class NoneCommunicator final : public Communicator {
   public:
    explicit NoneCommunicator(double timeout) { timeout_s_ = timeout; }
    const char* backend() const override { return "none"; }
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string host() const override {
        char h[256] = {0};
        if (gethostname(h, sizeof h - 1) != 0) return "localhost";
        return h;
    }
    void allreduce_sum(void*, size_t, ReduceType, const char*) override {}
    void broadcast(void*, size_t, int root, const char*) override {
        if (root != 0) throw DistError(str("broadcast from rank ", root, " in a single-process run (expected root 0)"));
    }
    std::vector<uint64_t> allgather_u64(uint64_t v, const char*) override { return {v}; }
    void barrier(const char*) override {}
};

std::unique_ptr<Communicator>& process_slot() {
    static std::unique_ptr<Communicator> c;
    return c;
}

}  // namespace

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr; }

bool have_mpi() {
#ifdef KVLAB_HAVE_MPI
    return true;
#else
    return false;
#endif
}

bool have_nccl() {
#ifdef KVLAB_HAVE_NCCL
    return true;
#else
    return false;
#endif
}

std::vector<std::string> available_backends() {
    std::vector<std::string> b = {"none"};
    if (have_mpi()) b.push_back("mpi");
    if (have_nccl()) b.push_back("nccl");
    return b;
}

std::unique_ptr<Communicator> make_communicator(const DistOptions& opt) {
    std::string b = opt.backend.empty() ? "auto" : opt.backend;
    if (b != "auto" && b != "none" && b != "mpi" && b != "nccl")
        throw Error(str("--dist.backend: '", b, "' is not a backend; expected auto, none, mpi or nccl"));
    if (!(opt.timeout_s > 0)) throw Error(str("--dist.timeout: ", opt.timeout_s, " s; expected a positive number of seconds"));
    if (b == "auto") b = launched_by_mpirun() ? "mpi" : "none";
    if (b == "none") {
        if (launched_by_mpirun() && std::getenv("OMPI_COMM_WORLD_SIZE") && std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")) > 1)
            throw Error("--dist.backend none under mpirun with several ranks: every rank would run the whole job on its own",
                        "use --dist.backend mpi (or nccl), or start one process without mpirun");
        return std::make_unique<NoneCommunicator>(opt.timeout_s);
    }
#ifdef KVLAB_HAVE_MPI
    std::unique_ptr<Communicator> mpi = detail::make_mpi_communicator(opt);
    if (b == "mpi") return mpi;
#ifdef KVLAB_HAVE_NCCL
    return detail::make_nccl_communicator(opt, std::move(mpi));
#else
    throw Error("--dist.backend nccl: this kvlab was built without NCCL (no nccl.h / libnccl in the CUDA toolkit at build time)",
                "use --dist.backend mpi, or rebuild on a machine whose CUDA toolkit ships NCCL");
#endif
#else
    throw Error(str("--dist.backend ", b, ": this kvlab was built without MPI (CMake found no MPI; KVLAB_MPI=AUTO)"),
                "install libopenmpi-dev and openmpi-bin (scripts/setup.sh) and rebuild");
#endif
}

void install_process_communicator(std::unique_ptr<Communicator> comm) { process_slot() = std::move(comm); }
Communicator* process_communicator() { return process_slot().get(); }
int process_ranks() { return process_slot() ? process_slot()->size() : 1; }
int process_rank() { return process_slot() ? process_slot()->rank() : 0; }

void maybe_injected_death(int64_t step) {
    static const char* spec = std::getenv("KVLAB_DIST_KILL");
    if (!spec || !*spec) return;
    int rank = -1;
    long long at = -1;
    if (std::sscanf(spec, "%d:%lld", &rank, &at) != 2) return;
    if (rank == process_rank() && at == step) {
        std::fprintf(stderr, "kvlab: rank %d: KVLAB_DIST_KILL=%s: killing this rank at step %lld (test hook)\n", rank, spec, at);
        std::fflush(stderr);
        std::raise(SIGKILL);
    }
}

}  // namespace kv::dist
