// Name tables for the telemetry enums and payload ownership of events. The names are stored in
// session files, so they only ever grow; never rename one.
#include "event_types.h"

#include "engine/core/error.h"

namespace kv::trace {

namespace {
const char* const kEventTypeNames[] = {"span",   "alloc", "cache_step", "scores",   "cell",
                                       "metric", "log",   "progress",   "gpu_batch"};
static_assert(sizeof(kEventTypeNames) / sizeof(kEventTypeNames[0]) == kNumEventTypes,
              "event type name table out of date");

const char* const kSpanCategoryNames[] = {
    "run",      "cell",       "layer",           "chunk", "attention", "mlp",       "norm", "cache_update", "scoring",
    "quantize", "dequantize", "checkpoint_copy", "head",  "backward",  "optimizer", "io",   "other"};
static_assert(sizeof(kSpanCategoryNames) / sizeof(kSpanCategoryNames[0]) == kNumSpanCategories,
              "span category name table out of date");

const char* const kLogLevelNames[] = {"debug", "info", "warning", "error"};
static_assert(sizeof(kLogLevelNames) / sizeof(kLogLevelNames[0]) == kNumLogLevels, "log level name table out of date");
}  // namespace

const char* event_type_name(EventType t) { return size_t(t) < kNumEventTypes ? kEventTypeNames[size_t(t)] : "unknown"; }

const char* span_category_name(SpanCategory c) {
    return size_t(c) < kNumSpanCategories ? kSpanCategoryNames[size_t(c)] : "unknown";
}

SpanCategory span_category_from_name(const std::string& name) {
    for (size_t i = 0; i < kNumSpanCategories; ++i)
        if (name == kSpanCategoryNames[i]) return SpanCategory(i);
    std::string all;
    for (size_t i = 0; i < kNumSpanCategories; ++i) all += (i ? ", " : "") + std::string(kSpanCategoryNames[i]);
    throw Error(str("unknown span category '", name, "'; expected one of: ", all));
}

const char* log_level_name(LogLevel l) { return size_t(l) < kNumLogLevels ? kLogLevelNames[size_t(l)] : "unknown"; }

std::string device_code_name(int code) { return code < 0 ? std::string("cpu") : str("cuda:", code); }

bool event_has_payload(EventType t) {
    switch (t) {
        case EventType::CACHE_STEP:
        case EventType::SCORES:
        case EventType::LOG:
        case EventType::GPU_BATCH:
            return true;
        default:
            return false;
    }
}

void event_free_payload(Event& ev) {
    switch (ev.type()) {
        case EventType::CACHE_STEP:
            delete ev.cache_step.replay_log;
            ev.cache_step.replay_log = nullptr;
            break;
        case EventType::SCORES:
            delete ev.scores.payload;
            ev.scores.payload = nullptr;
            break;
        case EventType::LOG:
            delete ev.log.text;
            ev.log.text = nullptr;
            break;
        case EventType::GPU_BATCH:
            delete ev.gpu.payload;
            ev.gpu.payload = nullptr;
            break;
        default:
            break;
    }
}

}  // namespace kv::trace
