// The phases a run's time divides into, so that no stretch of it is unattributed: each phase
// is a RUN-category span on the timeline (named as below) and a per-thread clock of exclusive
// seconds (a phase opened inside another pauses the outer one's clock), which the run's
// summary reports as `phase_seconds`. The instrumentation phases measure the run rather than
// being it; the headline speed leaves them out.
//
//   PhaseScope p(RunPhase::POLICY_PASS);   // until the end of the scope
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace kv {

enum class RunPhase : uint8_t {
    LOAD = 0,            // model weights, tokenizer, memory checks
    DATA,                // building and tokenizing the samples, planning chunks
    POLICY_PASS,         // the model with the cache policy: what the run is about
    RECONSTRUCTION,      // a policy's context reconstruction (kvzip), part of its cost
    BACKWARD,            // gradients through the cache policy
    FIDELITY_ATTENTION,  // per layer: the policy's attention against full attention (instrumentation)
    FIDELITY_REFERENCE,  // the dense model's stream for the next-token KL (instrumentation)
    KL_HEADS,            // lm_head over both streams and the KL (instrumentation)
    TELEMETRY,           // handing measurements on to the session (instrumentation)
    FINISH,              // the run's summary, and releasing the model and cache
    COUNT
};
constexpr size_t kNumRunPhases = size_t(RunPhase::COUNT);

// "load", "data", "policy pass", "reconstruction", "backward", "fidelity attention",
// "fidelity reference", "KL heads", "telemetry", "finish".
const char* run_phase_name(RunPhase p);
bool run_phase_is_instrumentation(RunPhase p);

using PhaseSeconds = std::array<double, kNumRunPhases>;

class PhaseScope {
   public:
    explicit PhaseScope(RunPhase phase);
    ~PhaseScope();
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;
    // Exclusive seconds this thread has spent in each phase so far, the open one's until now
    // (take differences).
    static PhaseSeconds thread_seconds();

   private:
    RunPhase phase_;
    PhaseScope* outer_;
    uint64_t resumed_ns_;
    uint64_t span_t0_ns_;
};

// b - a, phase by phase.
PhaseSeconds phase_seconds_since(const PhaseSeconds& a, const PhaseSeconds& b);

}  // namespace kv
