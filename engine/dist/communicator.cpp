// The none backend, backend selection and the process communicator (see communicator.h).
#include "communicator.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "backends.h"
#include "kernels/cpu/cpu_variants.h"

#ifdef KVLAB_HAVE_NCCL
#include <dlfcn.h>
#endif
#ifndef KVLAB_NCCL_PLUGIN_PATH
#define KVLAB_NCCL_PLUGIN_PATH ""
#endif

namespace kv::dist {

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

#ifdef KVLAB_HAVE_NCCL
namespace detail {
// libkvlab_dist_nccl.so: next to the executable (build/bin, the package), else where it was built.
std::unique_ptr<Communicator> load_nccl_communicator(const DistOptions& opt, std::unique_ptr<Communicator> mpi) {
    std::vector<std::string> candidates;
    for (const std::string& dir : cpu::plugin_dirs()) candidates.push_back(dir + "/libkvlab_dist_nccl.so");
    if (!std::string(KVLAB_NCCL_PLUGIN_PATH).empty()) candidates.push_back(KVLAB_NCCL_PLUGIN_PATH);
    std::string errors;
    for (const auto& path : candidates) {
        if (access(path.c_str(), R_OK) != 0) continue;
        void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: the communicator's code lives there
        if (!h) {
            errors += str(" ", path, ": ", dlerror(), ";");
            continue;
        }
        using CreateFn = Communicator* (*)(const DistOptions*, Communicator*, char*, size_t);
        auto create = reinterpret_cast<CreateFn>(dlsym(h, "kvlab_dist_nccl_create"));
        if (!create) {
            errors += str(" ", path, ": missing kvlab_dist_nccl_create;");
            continue;
        }
        char error[1024] = {0};
        Communicator* c = create(&opt, mpi.release(), error, sizeof error);
        if (!c) {
            std::string what = error, hint;
            if (auto nl = what.find('\n'); nl != std::string::npos) hint = what.substr(nl + 1), what.resize(nl);
            throw Error(what, hint);
        }
        return std::unique_ptr<Communicator>(c);
    }
    throw Error(str("--dist.backend nccl: the NCCL plugin libkvlab_dist_nccl.so ",
                    errors.empty() ? "was not found next to the executable" : "failed to load:" + errors),
                "it needs the CUDA runtime and NCCL of the toolkit kvlab was built with (LD_LIBRARY_PATH)");
}
}  // namespace detail
#endif

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
    return detail::load_nccl_communicator(opt, std::move(mpi));
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
