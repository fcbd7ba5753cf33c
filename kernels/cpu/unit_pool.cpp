// Work units shared by the calling thread and persistent helpers (see unit_pool.h).
// Protocol: the caller publishes a job (generation + 1) and wakes the helpers; a helper
// joins the job only while it is open (under the mutex), then claims units from the job's
// atomic counter. When the counter runs out the caller closes the job and waits for the
// helpers that joined to leave; helpers that had not joined by then never see the job.
#include "unit_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace kv::cpu {

namespace {

struct Job {
    void (*fn)(void*, int64_t) = nullptr;
    void* ctx = nullptr;
    int64_t units = 0;
    std::atomic<int64_t> next{0};
};

void drain(Job& j) {
    for (int64_t u = j.next.fetch_add(1, std::memory_order_relaxed); u < j.units; u = j.next.fetch_add(1, std::memory_order_relaxed))
        j.fn(j.ctx, u);
}

class Pool {
   public:
    void run(int threads, Job& job) {
        std::unique_lock<std::mutex> caller(call_mu_);  // one job at a time (concurrent callers queue)
        grow(threads - 1);
        {
            std::lock_guard<std::mutex> lk(mu_);
            job_ = &job;
            wanted_ = threads - 1;
            ++generation_;
        }
        wake_.notify_all();
        drain(job);
        std::unique_lock<std::mutex> lk(mu_);
        job_ = nullptr;  // closed: late helpers no longer join
        left_.wait(lk, [&] { return joined_ == 0; });
    }

   private:
    void grow(int helpers) {
        std::lock_guard<std::mutex> lk(mu_);
        while (int(threads_.size()) < helpers) {
            const int index = int(threads_.size());
            threads_.emplace_back([this, index] { helper(index); });
            threads_.back().detach();  // the pool lives until exit; blocked helpers die with the process
        }
    }

    void helper(int index) {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            wake_.wait(lk, [&] { return generation_ != seen; });
            seen = generation_;
            if (!job_ || index >= wanted_) continue;
            Job* j = job_;
            ++joined_;
            lk.unlock();
            drain(*j);
            lk.lock();
            if (--joined_ == 0) left_.notify_all();
        }
    }

    std::mutex call_mu_;
    std::mutex mu_;
    std::condition_variable wake_, left_;
    std::vector<std::thread> threads_;
    Job* job_ = nullptr;
    int wanted_ = 0;
    int joined_ = 0;
    uint64_t generation_ = 0;
};

Pool& pool() {
    static Pool* p = new Pool;  // never destroyed: helpers may still be blocked at exit
    return *p;
}

}  // namespace

void run_units(int threads, int64_t units, void (*fn)(void* ctx, int64_t unit), void* ctx) {
    Job job;
    job.fn = fn;
    job.ctx = ctx;
    job.units = units;
    threads = int(std::min<int64_t>(threads, units));
    if (threads <= 1) {
        drain(job);
        return;
    }
    pool().run(threads, job);
}

}  // namespace kv::cpu
