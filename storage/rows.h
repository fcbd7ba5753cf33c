// Row types returned by SessionReader: one struct per table the GUI and exports read, with the
// row id so callers can ask for "rows newer than the last one I saw". Names and labels are
// resolved from StringIds. Value types only.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/memory/mem_category.h"
#include "engine/telemetry/event_types.h"

namespace kv::storage {

// [t0_ns, t1_ns) on the engine clock; the default covers everything.
struct TimeWindow {
    int64_t t0_ns = std::numeric_limits<int64_t>::min();
    int64_t t1_ns = std::numeric_limits<int64_t>::max();
};

struct SpanRow {
    int64_t id = 0;
    int64_t start_ns = 0, end_ns = 0;
    std::string name;
    trace::SpanCategory category = trace::SpanCategory::OTHER;
    int32_t layer = -1, chunk = -1, cell_row = -1, cell_col = -1;
    int32_t thread = 0;
    int32_t device = -1;  // trace::device_code: -1 cpu, n cuda:n
    int32_t stream = 0;
    int64_t correlation_id = 0;
};

struct MemoryEventRow {
    int64_t id = 0;
    int64_t t_ns = 0;
    int64_t bytes = 0;  // > 0 alloc, < 0 free, 0 baseline
    MemCategory category = MemCategory::WORKSPACE;
    int32_t device = -1;
    std::string label;
    int64_t alloc_id = 0;
    uint64_t address = 0;
    int64_t category_total = 0, device_total = 0;
    int32_t layer = -1, chunk = -1;
    uint8_t flags = 0;  // trace::AllocFlags
};

// n equal time buckets over [t0, t1): bucket b starts at bucket_start(b) (integer ns, so widths
// differ by at most 1 ns) and bucket_index(t) is the b whose [start(b), start(b + 1)) holds t,
// clamped to [0, n). Readers, views and exports share these so an event is always counted in
// the bucket whose reported range contains it.
inline int64_t bucket_start(int64_t t0, int64_t t1, int n, int b) {
    return b >= n ? t1 : t0 + int64_t(double(t1 - t0) / double(n) * double(b));
}
inline int bucket_index(int64_t t, int64_t t0, int64_t t1, int n) {
    int b = int(double(t - t0) / (double(t1 - t0) / double(n)));
    b = b < 0 ? 0 : b >= n ? n - 1 : b;
    while (b + 1 < n && t >= bucket_start(t0, t1, n, b + 1)) ++b;
    while (b > 0 && t < bucket_start(t0, t1, n, b)) --b;
    return b;
}

// One bucket of a decimated memory timeline for one device.
struct MemoryBucket {
    int64_t t0_ns = 0, t1_ns = 0;
    int64_t events = 0;
    int64_t total_min = 0, total_max = 0, total_last = 0;
    // Per-category bytes at the moment the bucket's device total peaked.
    std::array<int64_t, kNumMemCategories> at_max{};
};

struct CacheStepRow {
    int64_t id = 0;
    int32_t layer = 0, chunk = 0, pass = 0;
    int64_t t_ns = 0;
    int64_t input_pos = 0;
    int32_t num_tokens = 0, cache_length = 0;
    std::vector<uint8_t> replay_log;
};

struct ScoreRow {
    int64_t id = 0;
    int32_t layer = 0, chunk = 0, pass = 0;
    int64_t t_ns = 0;
    int32_t B = 0, G = 0, T = 0;
    trace::ScoreStats stats;
    bool has_values = false;    // the full array was stored for this chunk
    std::vector<float> values;  // (B, G, T) row-major when has_values and requested
};

struct CellRow {
    int64_t id = 0;
    int32_t row = 0, col = 0;
    int32_t layer_begin = 0, layer_end = 0, chunk_begin = 0, chunk_end = 0;
    int64_t start_ns = 0, end_ns = 0;
    int64_t peak_bytes = 0;
    int32_t device = -1;
};

struct MetricRow {
    int64_t id = 0;
    std::string name;
    int64_t step = 0;
    double value = 0;
    int64_t t_ns = 0;
};

// One evaluated sample (schema v4 table sample_tokens): its input token ids, the tokenizer's
// piece (decoded text, spaces kept; may be an incomplete UTF-8 sequence) per token, and the
// loss the evaluation scored at each input position t (cross-entropy of the prediction made at
// t: of the token at t + 1, or of the answer class at the last position); NaN where nothing was
// scored. The sample's mean loss is the mean of the finite entries.
struct SampleTokensRow {
    int64_t id = 0;
    int64_t sample = 0;  // index in the run (= the eviction map's sequence)
    std::string description;
    std::vector<int32_t> ids;          // (T)
    std::vector<std::string> pieces;   // (T) or empty
    std::vector<float> loss;           // (T) or empty
    double mean_loss = std::numeric_limits<double>::quiet_NaN();
    int64_t scored = 0;                // finite entries of loss
    int32_t correct = -1;              // 1/0 where the task has a right answer, else -1
    double token_accuracy = -1;        // repeat/RULER: answer tokens right; -1 otherwise
};

struct LogRow {
    int64_t id = 0;
    int64_t t_ns = 0;
    std::string level;
    int32_t thread = 0;
    std::string text;
};

// Kernel, memcpy or memset from the CUPTI tables, joined to the engine span that launched it.
struct GpuActivityRow {
    enum Kind : uint8_t { KERNEL, MEMCPY, MEMSET } kind = KERNEL;
    int64_t start_ns = 0, end_ns = 0;
    int32_t device = 0;
    int32_t stream = 0;
    int64_t correlation_id = 0;
    int64_t external_id = 0;  // spans.correlation_id, 0 when unknown
    std::string name;         // kernel short name, or "memcpy HtoD" / "memset"
    int64_t bytes = 0;
};

}  // namespace kv::storage
