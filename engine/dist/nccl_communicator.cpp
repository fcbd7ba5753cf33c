// The nccl backend (see communicator.h): sums on the GPUs with NCCL, everything else over the
// MPI communicator that bootstrapped it. Built only when the CUDA toolkit ships NCCL and MPI
// was found (KVLAB_HAVE_NCCL), as a plugin loaded on demand (libkvlab_dist_nccl.so next to the
// executable), so kvlab itself never links the CUDA runtime or NCCL and runs where they are
// absent. The communicator is non-blocking (ncclConfig_t::blocking = 0), so every operation is
// polled against the deadline and aborted when it passes.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <cstring>

#include "communicator.h"

namespace kv::dist {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

ncclDataType_t nccl_type(ReduceType t) {
    switch (t) {
        case ReduceType::F32: return ncclFloat32;
        case ReduceType::F64: return ncclFloat64;
        case ReduceType::I64: return ncclInt64;
    }
    return ncclFloat32;
}

class NcclCommunicator final : public Communicator {
   public:
    NcclCommunicator(const DistOptions& opt, std::unique_ptr<Communicator> mpi) : mpi_(std::move(mpi)) {
        timeout_s_ = opt.timeout_s;
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
            throw Error(str("--dist.backend nccl: rank ", mpi_->rank(), " on ", mpi_->host(), " sees no CUDA device"), "use --dist.backend mpi on CPU ranks");
        // One GPU per rank on each host: the local rank picks it (mpirun sets it).
        const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        device_ = (lr ? std::atoi(lr) : mpi_->rank()) % devices;
        cuda_check(cudaSetDevice(device_), "cudaSetDevice");
        cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        ncclUniqueId id;
        if (mpi_->rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        mpi_->broadcast(&id, sizeof id, 0, "nccl unique id");
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        nccl_check(ncclCommInitRankConfig(&comm_, mpi_->size(), id, mpi_->rank(), &config), "ncclCommInitRankConfig");
        wait_comm("communicator setup");
    }
    ~NcclCommunicator() override {
        if (comm_) {
            if (broken_) ncclCommAbort(comm_);
            else ncclCommDestroy(comm_);
        }
        if (staging_) cudaFree(staging_);
        if (stream_) cudaStreamDestroy(stream_);
    }

    const char* backend() const override { return "nccl"; }
    int rank() const override { return mpi_->rank(); }
    int size() const override { return mpi_->size(); }
    std::string host() const override { return mpi_->host() + str(" (cuda:", device_, ")"); }
    bool broken() const override { return broken_ || mpi_->broken(); }

    void allreduce_sum(void* data, size_t count, ReduceType type, const char* what) override {
        if (broken_) throw DistError(str("rank ", rank(), ": all-reduce '", what, "' on a communicator broken by an earlier failure"));
        const size_t bytes = count * reduce_type_size(type);
        cudaPointerAttributes attr{};
        const bool on_device = cudaPointerGetAttributes(&attr, data) == cudaSuccess && attr.type == cudaMemoryTypeDevice;
        cudaGetLastError();  // a host pointer may leave an error behind on older runtimes
        void* buf = data;
        if (!on_device) {
            // Host memory is staged through one device buffer, grown as needed.
            if (staging_bytes_ < bytes) {
                if (staging_) cudaFree(staging_);
                staging_ = nullptr;
                cuda_check(cudaMalloc(&staging_, bytes), "cudaMalloc (all-reduce staging)");
                staging_bytes_ = bytes;
            }
            buf = staging_;
            cuda_check(cudaMemcpyAsync(buf, data, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
        }
        nccl_check(ncclAllReduce(buf, buf, count, nccl_type(type), ncclSum, comm_, stream_), "ncclAllReduce");
        if (!on_device) cuda_check(cudaMemcpyAsync(data, buf, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
        wait_stream("all-reduce", what);
    }
    void broadcast(void* data, size_t bytes, int root, const char* what) override { mpi_->broadcast(data, bytes, root, what); }
    std::vector<uint64_t> allgather_u64(uint64_t v, const char* what) override { return mpi_->allgather_u64(v, what); }
    void barrier(const char* what) override { mpi_->barrier(what); }

   private:
    void cuda_check(cudaError_t e, const char* call) {
        if (e == cudaSuccess) return;
        broken_ = true;
        throw DistError(str("rank ", mpi_->rank(), ": ", call, " failed: ", cudaGetErrorString(e)));
    }
    void nccl_check(ncclResult_t r, const char* call) {
        if (r == ncclSuccess || r == ncclInProgress) return;
        broken_ = true;
        throw DistError(str("rank ", mpi_->rank(), ": ", call, " failed: ", ncclGetErrorString(r)), "NCCL_DEBUG=INFO shows why");
    }
    // Waits for a non-blocking communicator call; on timeout aborts it and asks MPI which
    // peers are still there (that all-gather throws naming the missing ranks).
    void wait_comm(const char* what) {
        const double deadline = now_s() + timeout_s_;
        for (;;) {
            ncclResult_t st = ncclSuccess;
            ncclCommGetAsyncError(comm_, &st);
            if (st == ncclSuccess) return;
            if (st != ncclInProgress) nccl_check(st, what);
            if (now_s() > deadline) fail_timeout("nccl", what);
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    }
    void wait_stream(const char* kind, const char* what) {
        const double deadline = now_s() + timeout_s_;
        int spins = 0;
        for (;;) {
            const cudaError_t q = cudaStreamQuery(stream_);
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) cuda_check(q, "cudaStreamQuery");
            ncclResult_t st = ncclSuccess;
            ncclCommGetAsyncError(comm_, &st);
            if (st != ncclSuccess && st != ncclInProgress) nccl_check(st, what);
            if (now_s() > deadline) fail_timeout(kind, what);
            if (++spins > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    [[noreturn]] void fail_timeout(const char* kind, const char* what) {
        broken_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        mpi_->barrier("liveness check after an NCCL timeout");  // throws naming the missing ranks
        throw DistError(str("rank ", mpi_->rank(), ": NCCL ", kind, " '", what, "' did not complete within ", timeout_s_,
                            " s although every rank is alive (a GPU or the network failed); stopping"),
                        "NCCL_DEBUG=INFO shows why");
    }

    std::unique_ptr<Communicator> mpi_;
    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    void* staging_ = nullptr;
    size_t staging_bytes_ = 0;
    int device_ = 0;
    bool broken_ = false;
};

}  // namespace
}  // namespace kv::dist

// The plugin's entry point: takes ownership of `mpi`; on failure returns nullptr with the
// message (and hint) in `error` (no exception crosses the library boundary).
extern "C" __attribute__((visibility("default"))) kv::dist::Communicator* kvlab_dist_nccl_create(const kv::dist::DistOptions* opt,
                                                                                                 kv::dist::Communicator* mpi,
                                                                                                 char* error, size_t error_size) {
    std::unique_ptr<kv::dist::Communicator> m(mpi);
    try {
        return new kv::dist::NcclCommunicator(*opt, std::move(m));
    } catch (const kv::Error& e) {
        std::snprintf(error, error_size, "%s%s%s", e.what(), e.hint().empty() ? "" : "\n", e.hint().c_str());
    } catch (const std::exception& e) {
        std::snprintf(error, error_size, "%s", e.what());
    }
    return nullptr;
}
