// Work units shared by the calling thread and persistent helpers (see unit_pool.h).
// Protocol: the caller publishes a job (generation + 1) and wakes the helpers; a helper
// joins the job only while it is open (under the mutex), then claims units from the job's
// atomic counter. When the counter runs out the caller closes the job and waits for the
// helpers that joined to leave; helpers that had not joined by then never see the job.
#include "unit_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_PAUSE() _mm_pause()
#else
#define KV_PAUSE() ((void)0)
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

// A helper that finished a job polls for the next one this long before it sleeps on the
// condition variable, and the caller polls this long for joined helpers to leave: a decode
// step issues ~120 jobs per token microseconds apart, and a futex sleep + wake per job can
// cost more than the job's work on a small model. Only while no thread waits for a CPU: the
// kernel's count of runnable threads (/proc/loadavg's fourth field, which counts our own
// running and polling threads) plus our sleeping helpers at most the CPU count, re-read every
// 100 ms. On a loaded machine a polling helper only takes the core from a runnable thread
// (2-thread generate at load 11-23: 23-50 tokens/s polling 50 us against 42-65 sleeping at
// once). The 1-minute load average was the gate before: it lags by a minute, so right after
// another busy process (a benchmark's other side) it kept helpers sleeping on idle cores —
// 2-thread SmolLM2 decode 57-74 tokens/s sleeping against 67-99 polling, paired on idle cores.
// KVLAB_POOL_SPIN_US overrides the window (0: always sleep at once).
constexpr int64_t kSpinNs = int64_t(200) * 1000;

// Runnable threads on the machine now (/proc/loadavg: "1.0 0.9 0.8 3/345 12345"), or -1.
int runnable_threads() {
    FILE* f = std::fopen("/proc/loadavg", "r");
    if (!f) return -1;
    double l1, l5, l15;
    int running = -1, total = 0;
    if (std::fscanf(f, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5) running = -1;
    std::fclose(f);
    return running;
}

// Pool helpers blocked on the condition variable: they are not in the runnable count, but
// would be once polling.
std::atomic<int> sleeping_helpers{0};

bool cores_idle() {
    const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
    const int running = runnable_threads();
    if (running >= 0) return running + sleeping_helpers.load(std::memory_order_relaxed) <= cpus;
    double load = 0;  // no /proc: the load average, the older and laggier measure
    return getloadavg(&load, 1) == 1 && load < double(cpus) - 0.5;
}

int64_t spin_ns() {
    static const int64_t forced = [] {
        const char* e = std::getenv("KVLAB_POOL_SPIN_US");
        return e && *e ? int64_t(std::atoll(e)) * 1000 : int64_t(-1);
    }();
    if (forced >= 0) return forced;
    static std::atomic<int64_t> checked_ns{0};
    static std::atomic<bool> idle_cores{false};
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    int64_t last = checked_ns.load(std::memory_order_relaxed);
    // One thread re-reads (the others keep the last answer meanwhile).
    if (now - last > 100'000'000 && checked_ns.compare_exchange_strong(last, now, std::memory_order_relaxed))
        idle_cores.store(cores_idle(), std::memory_order_relaxed);
    return idle_cores.load(std::memory_order_relaxed) ? kSpinNs : 0;
}

// Polls done() with pause instructions for up to spin_ns(); true when it became true.
template <class Done>
bool spin_until(Done done) {
    const int64_t limit = spin_ns();
    if (limit <= 0) return done();
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    for (;;) {
        for (int i = 0; i < 32; ++i) {
            if (done()) return true;
            KV_PAUSE();
        }
        std::this_thread::yield();  // a runnable thread (on a loaded machine, maybe the caller) goes first
        if (std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count() >= limit) return done();
    }
}

// Set while a thread runs units: a unit that calls run_units again (a kernel inside another's
// unit) runs the inner units itself, since the pool takes one job at a time.
thread_local bool in_unit = false;

void drain(Job& j) {
    const bool outer = in_unit;
    in_unit = true;
    for (int64_t u = j.next.fetch_add(1, std::memory_order_relaxed); u < j.units; u = j.next.fetch_add(1, std::memory_order_relaxed))
        j.fn(j.ctx, u);
    in_unit = outer;
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
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        drain(job);
        {
            std::lock_guard<std::mutex> lk(mu_);
            job_ = nullptr;  // closed: late helpers no longer join
        }
        spin_until([&] { return joined_.load(std::memory_order_acquire) == 0; });
        std::unique_lock<std::mutex> lk(mu_);
        left_.wait(lk, [&] { return joined_.load(std::memory_order_relaxed) == 0; });
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
            if (generation_.load(std::memory_order_relaxed) == seen) {
                lk.unlock();
                spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
                lk.lock();
            }
            sleeping_helpers.fetch_add(1, std::memory_order_relaxed);
            wake_.wait(lk, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
            sleeping_helpers.fetch_sub(1, std::memory_order_relaxed);
            seen = generation_.load(std::memory_order_relaxed);
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
    std::atomic<int> joined_{0};     // written under mu_; read without it while spinning
    std::atomic<uint64_t> generation_{0};
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
    if (threads <= 1 || in_unit) {
        drain(job);
        return;
    }
    pool().run(threads, job);
}

}  // namespace kv::cpu
