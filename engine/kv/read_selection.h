// Capability: reading a selection of the cache. A read policy (quest) attends over the slots each
// query selects instead of all of them. The live cache runs it through the policy's SelectsReads
// capability (policy_capabilities.h); the gradient replay (engine/grad/replay_cache.*) runs it
// forward and backward over its own full-precision K/V through this interface, without knowing
// which policy selects. The registry attaches it (PolicyInfo::read_selection); policies that
// read every slot have none.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/tensor.h"

namespace kv {

struct KVCacheConfig;

class ReadSelection {
   public:
    virtual ~ReadSelection() = default;
    // Whether a chunk after the prefill over `length` filled slots reads a selection (else the
    // plain attention over every slot is the same thing).
    virtual bool selects(int64_t length) const = 0;
    // y = attention of q (B, NH, n, D) over the slots of K, V (B, G, T, D) with positions kpos
    // that each query selects; what was selected goes into *sel for backward().
    virtual void attend(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const Tensor& kpos, const Tensor& qpos,
                        float scale, std::vector<int32_t>* sel) const = 0;
    // The gradient of attend(): dq written, dK and dV (B, G, T, D) accumulated. pos holds slot
    // positions (B, G, stride) row-major on the host; the queries start at input_pos.
    virtual void backward(Tensor& dq, Tensor& dK, Tensor& dV, const Tensor& q, const Tensor& K, const Tensor& V,
                          const std::vector<int32_t>& pos, int64_t stride, int64_t input_pos, const Tensor& dy, float scale,
                          const std::vector<int32_t>& sel) const = 0;
};

// The read selection of cfg's policy (PolicyInfo::read_selection), null when it reads every slot.
std::unique_ptr<ReadSelection> make_read_selection(const KVCacheConfig& cfg);

}  // namespace kv
