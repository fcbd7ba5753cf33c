// The mpi backend (see communicator.h): MPI_COMM_WORLD duplicated, errors returned rather than
// fatal, and every collective non-blocking, polled against a deadline. Built only when CMake
// found MPI (KVLAB_HAVE_MPI).
// The C API only: the deprecated C++ bindings in Open MPI's mpi.h do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>

#include "backends.h"

namespace kv::dist::detail {

namespace {

constexpr int kArrivalTag = 7411;  // "arrived at collective #k" messages

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

MPI_Datatype mpi_type(ReduceType t) {
    switch (t) {
        case ReduceType::F32: return MPI_FLOAT;
        case ReduceType::F64: return MPI_DOUBLE;
        case ReduceType::I64: return MPI_INT64_T;
    }
    return MPI_BYTE;
}

std::string mpi_error_text(int code) {
    char buf[MPI_MAX_ERROR_STRING] = {0};
    int n = 0;
    MPI_Error_string(code, buf, &n);
    return std::string(buf, size_t(n));
}

class MpiCommunicator final : public Communicator {
   public:
    explicit MpiCommunicator(double timeout) {
        timeout_s_ = timeout;
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited) {
            // The training loop's collectives run on the run's worker thread, the init and the
            // finalize on the main thread: never two at once, which SERIALIZED allows.
            int provided = 0;
            if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
                throw Error("MPI_Init_thread failed", "start kvlab with mpirun, or use --dist.backend none");
            owns_mpi_ = true;
            if (provided < MPI_THREAD_SERIALIZED)
                throw Error(str("this MPI provides thread level ", provided, "; kvlab needs MPI_THREAD_SERIALIZED (", MPI_THREAD_SERIALIZED,
                                ") because collectives run on a worker thread"));
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
        char name[MPI_MAX_PROCESSOR_NAME] = {0};
        int len = 0;
        MPI_Get_processor_name(name, &len);
        host_.assign(name, size_t(len));
    }
    ~MpiCommunicator() override {
        // After a failed collective the peers may be dead: MPI_Finalize would wait for them.
        if (broken_ || !owns_mpi_) return;
        MPI_Comm_free(&comm_);
        MPI_Finalize();
    }

    const char* backend() const override { return "mpi"; }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string host() const override { return host_; }
    bool broken() const override { return broken_; }

    void allreduce_sum(void* data, size_t count, ReduceType type, const char* what) override {
        // MPI counts are int: large buffers go in pieces.
        const size_t piece = size_t(1) << 28;
        char* p = static_cast<char*>(data);
        for (size_t off = 0; off < count || (count == 0 && off == 0); off += piece) {
            const int n = int(std::min(piece, count - off));
            run("all-reduce", what, [&](MPI_Request* r) {
                return MPI_Iallreduce(MPI_IN_PLACE, p + off * reduce_type_size(type), n, mpi_type(type), MPI_SUM, comm_, r);
            });
            if (count == 0) break;
        }
    }

    void broadcast(void* data, size_t bytes, int root, const char* what) override {
        if (root < 0 || root >= size_) throw DistError(str("broadcast '", what, "' from rank ", root, "; expected a rank below ", size_));
        const size_t piece = size_t(1) << 30;
        char* p = static_cast<char*>(data);
        for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += piece) {
            const int n = int(std::min(piece, bytes - off));
            run("broadcast", what, [&](MPI_Request* r) { return MPI_Ibcast(p + off, n, MPI_BYTE, root, comm_, r); });
            if (bytes == 0) break;
        }
    }

    std::vector<uint64_t> allgather_u64(uint64_t value, const char* what) override {
        std::vector<uint64_t> all(size_t(size_), 0);
        run("all-gather", what, [&](MPI_Request* r) { return MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_, r); });
        return all;
    }

    void barrier(const char* what) override {
        run("barrier", what, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
    }

    void start_allreduce_sum(void* data, size_t count, ReduceType type, const char* what) override {
        const size_t piece = size_t(1) << 28;
        char* p = static_cast<char*>(data);
        for (size_t off = 0; off < count || (count == 0 && off == 0); off += piece) {
            const int n = int(std::min(piece, count - off));
            started_.push_back(post("all-reduce", what, [&](MPI_Request* r) {
                return MPI_Iallreduce(MPI_IN_PLACE, p + off * reduce_type_size(type), n, mpi_type(type), MPI_SUM, comm_, r);
            }));
            if (count == 0) break;
        }
    }
    void test_started() override {
        for (auto& op : started_) {
            int all = 0;
            check(MPI_Testall(int(op->reqs.size()), op->reqs.data(), &all, MPI_STATUSES_IGNORE), op->kind, op->what);
        }
    }
    void wait_started() override {
        // In start order; a failure leaves the rest (the communicator is broken anyway).
        std::deque<std::unique_ptr<Op>> ops;
        ops.swap(started_);
        for (auto& op : ops) complete(*op);
    }

   private:
    // One collective in flight: its arrival messages (N-1 sends of its sequence number, N-1
    // receives of the peers') and the operation itself, last in `reqs`.
    struct Op {
        const char* kind = "";
        const char* what = "";
        uint64_t seq = 0;
        std::vector<MPI_Request> reqs;
        std::vector<uint64_t> arrived;
        std::vector<int> recv_peer;  // rank of each arrival receive, in reqs order
    };

    // Announces arrival to every peer and starts the operation.
    template <class Start>
    std::unique_ptr<Op> post(const char* kind, const char* what, Start start) {
        if (broken_) throw DistError(str("rank ", rank_, ": ", kind, " '", what, "' on a communicator broken by an earlier failure"));
        auto op = std::make_unique<Op>();
        op->kind = kind, op->what = what, op->seq = ++seq_;
        op->arrived.assign(size_t(size_), 0);
        op->reqs.reserve(size_t(2 * size_));  // the send buffers and receives must not move
        for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            op->reqs.emplace_back();
            check(MPI_Isend(&op->seq, 1, MPI_UINT64_T, p, kArrivalTag, comm_, &op->reqs.back()), kind, what);
            op->reqs.emplace_back();
            check(MPI_Irecv(&op->arrived[size_t(p)], 1, MPI_UINT64_T, p, kArrivalTag, comm_, &op->reqs.back()), kind, what);
            op->recv_peer.push_back(p);
        }
        op->reqs.emplace_back();
        check(start(&op->reqs.back()), kind, what);
        return op;
    }

    // One blocking collective: post, then complete.
    template <class Start>
    void run(const char* kind, const char* what, Start start) {
        if (!started_.empty()) wait_started();  // collectives complete in the order they started
        std::unique_ptr<Op> op = post(kind, what, start);
        complete(*op);
    }

    // Polls the collective until done or the deadline. On failure the communicator is broken
    // and DistError names the peers that never arrived.
    void complete(Op& op) {
        const char* kind = op.kind;
        const char* what = op.what;
        std::vector<MPI_Request>& reqs = op.reqs;
        const std::vector<int>& recv_peer = op.recv_peer;
        const std::vector<uint64_t>& arrived = op.arrived;
        const uint64_t seq = op.seq;
        const double t_start = now_s(), deadline = t_start + timeout_s_;
        for (;;) {
            int all = 0;
            check(MPI_Testall(int(reqs.size()), reqs.data(), &all, MPI_STATUSES_IGNORE), kind, what);
            if (all) break;
            if (now_s() > deadline) {
                // Which peers never announced this collective?
                std::vector<int> missing;
                for (size_t i = 0; i < recv_peer.size(); ++i) {
                    int flag = 0;
                    MPI_Test(&reqs[2 * i + 1], &flag, MPI_STATUS_IGNORE);
                    if (!flag) missing.push_back(recv_peer[i]);
                }
                broken_ = true;
                std::string who;
                for (int m : missing) who += (who.empty() ? "" : ", ") + std::to_string(m);
                if (!missing.empty())
                    throw DistError(str("rank ", rank_, ": rank", missing.size() > 1 ? "s " : " ", who, " (of ", size_, ") did not reach ", kind,
                                        " '", what, "' #", seq, " within ", timeout_s_, " s: dead or stuck; stopping"),
                                    "check that rank's output; mpirun --enable-recovery lets the other ranks report it (--dist.timeout sets the wait)");
                throw DistError(str("rank ", rank_, ": ", kind, " '", what, "' #", seq, " did not complete within ", timeout_s_,
                                    " s although every rank reached it (a rank died during it, or the network failed); stopping"));
            }
            // Non-blocking collectives progress only inside MPI_Test*: poll flat out (yielding the
            // core) for the first 100 ms, as a blocking MPI call would, then every 50 us so a
            // rank waiting for a slower one leaves the core to it.
            if (now_s() - t_start > 0.1) std::this_thread::sleep_for(std::chrono::microseconds(50));
            else std::this_thread::yield();
        }
        for (size_t i = 0; i < recv_peer.size(); ++i)
            if (arrived[size_t(recv_peer[i])] != seq) {
                broken_ = true;
                throw DistError(str("rank ", rank_, ": rank ", recv_peer[i], " is at collective #", arrived[size_t(recv_peer[i])], " while this rank is at ",
                                    kind, " '", what, "' #", seq, ": the ranks ran different code paths"));
            }
    }

    void check(int code, const char* kind, const char* what) {
        if (code == MPI_SUCCESS) return;
        broken_ = true;
        throw DistError(str("rank ", rank_, ": MPI ", kind, " '", what, "' #", seq_, " failed: ", mpi_error_text(code)),
                        "a peer rank probably died; check its output");
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    std::string host_;
    uint64_t seq_ = 0;
    std::deque<std::unique_ptr<Op>> started_;  // start_allreduce_sum's, in start order
    bool owns_mpi_ = false;
    bool broken_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const DistOptions& opt) { return std::make_unique<MpiCommunicator>(opt.timeout_s); }

}  // namespace kv::dist::detail
