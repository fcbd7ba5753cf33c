// Data-parallel communication (issue 23): one interface over the distributed engines kvlab
// builds on, never a home-made transport.
//   none  one process; every collective is the identity
//   mpi   Open MPI ranks (processes on CPUs, across hosts): MPI_Iallreduce and friends
//   nccl  NCCL between GPUs for the sums; its communicator is set up from a unique id that
//         rank 0 broadcasts over MPI (as llm.c and Megatron do), and MPI carries the rest
// The rest of kvlab links MPI and NCCL only through this layer (engine/dist/CMakeLists.txt).
//
// Every collective has a deadline (DistOptions::timeout_s): a rank that died or hangs makes
// the others throw DistError naming the ranks that never arrived, instead of waiting forever.
// Arrival is known because each collective first posts a tiny "arrived at #k" message to every
// peer (N-1 sends of 8 bytes; N is small for data parallelism).
//
// The process communicator (install_process_communicator) is what the training loop and the
// sweep use; the CLI installs it when the process was started by mpirun or --dist.backend asks.
// Nothing is installed in the GUI or in tests that do not ask: then training runs as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace kv::dist {

// A collective failed: timeout, a dead peer, or the backend's error. what() names the ranks.
class DistError : public Error {
   public:
    using Error::Error;
};

enum class ReduceType { F32, F64, I64 };
inline size_t reduce_type_size(ReduceType t) { return t == ReduceType::F32 ? 4 : 8; }

struct DistOptions {
    std::string backend = "auto";  // auto | none | mpi | nccl
    double timeout_s = 300;        // per collective
};

class Communicator {
   public:
    virtual ~Communicator() = default;
    virtual const char* backend() const = 0;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // This rank's host name (for messages and the session).
    virtual std::string host() const = 0;

    // In place: data becomes the sum over ranks. Every rank passes the same count and type.
    // `data` may be device memory for the nccl backend (host memory is staged through the GPU).
    virtual void allreduce_sum(void* data, size_t count, ReduceType type, const char* what) = 0;
    // Non-blocking form of allreduce_sum (the gradient buckets that overlap the backward pass):
    // starts the sum and returns; `data` must stay untouched until wait_started(). Started sums
    // complete in the order they were started, and every rank starts the same ones in the same
    // order with no other collective in between. test_started() lets them progress (MPI moves
    // a non-blocking collective only inside MPI calls); wait_started() completes them all,
    // with the deadline of any collective. Default: the blocking sum, done at the start.
    virtual void start_allreduce_sum(void* data, size_t count, ReduceType type, const char* what) {
        allreduce_sum(data, count, type, what);
    }
    virtual void test_started() {}
    virtual void wait_started() {}
    // root's bytes to every rank.
    virtual void broadcast(void* data, size_t bytes, int root, const char* what) = 0;
    // Every rank's value, indexed by rank.
    virtual std::vector<uint64_t> allgather_u64(uint64_t value, const char* what) = 0;
    virtual void barrier(const char* what) = 0;
    // Marks the communicator broken after a failed collective (no clean shutdown is attempted).
    virtual bool broken() const { return false; }

    double timeout_s() const { return timeout_s_; }

   protected:
    double timeout_s_ = 300;
};

// True when this process was started by Open MPI's mpirun (OMPI_COMM_WORLD_SIZE is set).
bool launched_by_mpirun();
// Whether this build has the backend.
bool have_mpi();
bool have_nccl();
// Backend names this build offers ("none", "mpi", "nccl").
std::vector<std::string> available_backends();

// Resolves "auto" (mpi under mpirun, else none) and creates the communicator; initializes MPI
// when needed. Throws Error naming the backend and what is missing.
std::unique_ptr<Communicator> make_communicator(const DistOptions& opt);

// ---- the process communicator ----------------------------------------------------------------
// Installed once (by the CLI); lives until process exit, where MPI is finalized (skipped when
// a collective failed: the peers may be dead, and finalizing would wait for them).
void install_process_communicator(std::unique_ptr<Communicator> comm);
// nullptr when none was installed.
Communicator* process_communicator();
// Size of the process communicator (1 when none).
int process_ranks();
int process_rank();

// Test hook: KVLAB_DIST_KILL="RANK:STEP" makes that rank SIGKILL itself when it starts that
// optimizer step, so the suite can check that the others stop with a message (tests/dist).
void maybe_injected_death(int64_t step);

}  // namespace kv::dist
