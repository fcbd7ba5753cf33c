// Run phases (see run_phase.h).
#include "run_phase.h"

#include "engine/memory/memory_tracker.h"
#include "engine/telemetry/trace.h"

namespace kv {

namespace {

struct PhaseInfo {
    const char* name;
    bool instrumentation;
};
constexpr PhaseInfo kPhases[kNumRunPhases] = {
    {"load", false},
    {"data", false},
    {"policy pass", false},
    {"reconstruction", false},
    {"backward", false},
    {"fidelity attention", true},
    {"fidelity reference", true},
    {"KL heads", true},
    {"telemetry", true},
    {"finish", false},
};

thread_local PhaseScope* t_innermost = nullptr;
thread_local std::array<uint64_t, kNumRunPhases> t_phase_ns{};

const trace::Name& phase_span_name(RunPhase p) {
    static const trace::Name names[kNumRunPhases] = {
        trace::Name(kPhases[0].name), trace::Name(kPhases[1].name), trace::Name(kPhases[2].name),
        trace::Name(kPhases[3].name), trace::Name(kPhases[4].name), trace::Name(kPhases[5].name),
        trace::Name(kPhases[6].name), trace::Name(kPhases[7].name), trace::Name(kPhases[8].name),
        trace::Name(kPhases[9].name)};
    static_assert(kNumRunPhases == 10, "one span name per phase");
    return names[size_t(p)];
}

}  // namespace

const char* run_phase_name(RunPhase p) { return size_t(p) < kNumRunPhases ? kPhases[size_t(p)].name : "unknown"; }
bool run_phase_is_instrumentation(RunPhase p) { return size_t(p) < kNumRunPhases && kPhases[size_t(p)].instrumentation; }

PhaseScope::PhaseScope(RunPhase phase) : phase_(phase), outer_(t_innermost) {
    const uint64_t t = now_ns();
    if (outer_) t_phase_ns[size_t(outer_->phase_)] += t - outer_->resumed_ns_;
    resumed_ns_ = span_t0_ns_ = t;
    t_innermost = this;
}

PhaseScope::~PhaseScope() {
    const uint64_t t = now_ns();
    t_phase_ns[size_t(phase_)] += t - resumed_ns_;
    if (outer_) outer_->resumed_ns_ = t;
    t_innermost = outer_;
    if (trace::active()) trace::span_complete(trace::SpanCategory::RUN, phase_span_name(phase_), span_t0_ns_, t);
}

PhaseSeconds PhaseScope::thread_seconds() {
    PhaseSeconds s{};
    for (size_t i = 0; i < kNumRunPhases; ++i) s[i] = double(t_phase_ns[i]) * 1e-9;
    // The open phase's clock runs until now (the outer ones are paused behind it).
    if (t_innermost) s[size_t(t_innermost->phase_)] += double(now_ns() - t_innermost->resumed_ns_) * 1e-9;
    return s;
}

PhaseSeconds phase_seconds_since(const PhaseSeconds& a, const PhaseSeconds& b) {
    PhaseSeconds d{};
    for (size_t i = 0; i < kNumRunPhases; ++i) d[i] = b[i] - a[i];
    return d;
}

}  // namespace kv
