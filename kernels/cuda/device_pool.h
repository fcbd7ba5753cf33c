// A caching pool of device memory for the CUDA backend's tensors. cudaFree waits for the whole
// device, and the backend freed every temporary tensor with it: on an H200 a decode step kept
// the GPU busy 25% of the time (docs/GPU.md). The pool keeps freed blocks, by size rounded up,
// and hands one out again once the work queued on the legacy default stream before its free
// has finished (an event recorded at the free), so neither a later kernel nor a copy on the
// side stream can touch it while an earlier kernel still does. A failed cudaMalloc releases
// every cached block and tries once more. The engine's tracker still counts tensors, not the
// pool's blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace kv::cuda {

class DevicePool {
   public:
    explicit DevicePool(int device) : device_(device) {}
    DevicePool(const DevicePool&) = delete;
    DevicePool& operator=(const DevicePool&) = delete;

    // Blocks: multiples of 512 bytes up to 1 MiB, of 64 KiB above (repeated shapes reuse exactly).
    static size_t rounded(size_t bytes) {
        const size_t g = bytes <= (size_t(1) << 20) ? 512 : (size_t(64) << 10);
        return ((bytes ? bytes : 1) + g - 1) / g * g;
    }

    // Throws through check (KV_CUDA_CHECK's reporter) when even an empty pool cannot allocate.
    void* alloc(size_t bytes, void (*fail)(cudaError_t, const char*)) {
        const size_t size = rounded(bytes);
        {
            std::lock_guard<std::mutex> lk(mu_);
            collect_finished();
            auto it = ready_.find(size);
            if (it != ready_.end() && !it->second.empty()) {
                void* p = it->second.back();
                it->second.pop_back();
                return p;
            }
        }
        void* p = nullptr;
        cudaError_t err = cudaMalloc(&p, size);
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            release_cached();
            err = cudaMalloc(&p, size);
        }
        if (err != cudaSuccess) fail(err, "cudaMalloc");
        std::lock_guard<std::mutex> lk(mu_);
        size_of_[p] = size;
        return p;
    }

    void free(void* p) {
        if (!p) return;
        std::lock_guard<std::mutex> lk(mu_);
        auto it = size_of_.find(p);
        if (it == size_of_.end()) {  // not ours: give it back as before
            cudaFree(p);
            return;
        }
        cudaEvent_t ev = nullptr;
        if (!spare_events_.empty()) {
            ev = spare_events_.back();
            spare_events_.pop_back();
        } else if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            cudaFree(p);  // no event: fall back to the synchronising free
            size_of_.erase(it);
            return;
        }
        (void)cudaEventRecord(ev, nullptr);  // the legacy default stream: where the kernels run
        pending_.push_back({p, it->second, ev});
    }

    // Wait for the device, then cudaFree every cached block (live blocks stay).
    void release_cached() {
        std::lock_guard<std::mutex> lk(mu_);
        (void)cudaDeviceSynchronize();
        while (!pending_.empty()) {
            ready_[pending_.front().size].push_back(pending_.front().p);
            spare_events_.push_back(pending_.front().ev);
            pending_.pop_front();
        }
        for (auto& [size, blocks] : ready_)
            for (void* b : blocks) {
                cudaFree(b);
                size_of_.erase(b);
            }
        ready_.clear();
    }

    int device() const { return device_; }

   private:
    struct Pending {
        void* p;
        size_t size;
        cudaEvent_t ev;
    };
    // Pending blocks whose event completed become ready; events complete in the order recorded.
    void collect_finished() {
        while (!pending_.empty() && cudaEventQuery(pending_.front().ev) == cudaSuccess) {
            ready_[pending_.front().size].push_back(pending_.front().p);
            spare_events_.push_back(pending_.front().ev);
            pending_.pop_front();
        }
        (void)cudaGetLastError();  // cudaErrorNotReady is not an error to keep
    }

    int device_;
    std::mutex mu_;
    std::unordered_map<void*, size_t> size_of_;  // every block the pool made, live or cached
    std::map<size_t, std::vector<void*>> ready_;
    std::deque<Pending> pending_;
    std::vector<cudaEvent_t> spare_events_;
};

}  // namespace kv::cuda
