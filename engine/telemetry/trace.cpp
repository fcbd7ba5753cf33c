// Free tracing functions (see trace.h). Each builds one record and pushes it into the current
// recorder's queue for this thread; heavier work (score statistics, copying a score array) is
// done only when a recorder is installed.
#include "trace.h"

#include <cstring>
#include <utility>

#include "engine/telemetry/score_stats.h"

namespace kv::trace {

namespace detail {
constinit thread_local Recorder* t_recorder = nullptr;
constinit thread_local SpanContext t_context = {};
std::atomic<bool> g_gpu_correlation{false};
}  // namespace detail

void SpanScope::begin(Recorder* r, SpanCategory category, uint32_t name_id, const SpanArgs& args) {
    rec_ = r;
    span_ = SpanRecord{};
    span_.type = EventType::SPAN;
    span_.category = category;
    span_.device = device_code(args.device);
    span_.name_id = name_id;
    span_.layer = args.layer;
    span_.chunk = args.chunk;
    span_.cell_row = args.cell_row;
    span_.cell_col = args.cell_col;
    span_.stream = args.stream;
    span_.thread = thread_index();
    saved_ = detail::t_context;
    if (args.layer >= 0) detail::t_context.layer = args.layer;
    if (args.chunk >= 0) detail::t_context.chunk = args.chunk;
    if (detail::g_gpu_correlation.load(std::memory_order_acquire)) {
        span_.correlation_id = r->next_correlation_id();
        detail::gpu_push_correlation(span_.correlation_id);
    }
    span_.start_ns = now_ns();
}

void SpanScope::end() {
    span_.end_ns = now_ns();
    if (span_.correlation_id) detail::gpu_pop_correlation();
    detail::t_context = saved_;
    Event ev;
    ev.span = span_;
    rec_->push(ev);
}

void span_complete(SpanCategory category, Name name, uint64_t start_ns, uint64_t end_ns, const SpanArgs& args) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    Event ev;
    ev.span = SpanRecord{};
    ev.span.type = EventType::SPAN;
    ev.span.category = category;
    ev.span.device = device_code(args.device);
    ev.span.name_id = name.id;
    ev.span.start_ns = start_ns;
    ev.span.end_ns = end_ns < start_ns ? start_ns : end_ns;
    ev.span.layer = args.layer;
    ev.span.chunk = args.chunk;
    ev.span.cell_row = args.cell_row;
    ev.span.cell_col = args.cell_col;
    ev.span.thread = thread_index();
    ev.span.stream = args.stream;
    r->push(ev);
}

void metric(Name name, int64_t step, double value) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    Event ev;
    ev.metric = MetricRecord{};
    ev.metric.type = EventType::METRIC;
    ev.metric.name_id = name.id;
    ev.metric.step = step;
    ev.metric.value = value;
    ev.metric.t_ns = now_ns();
    r->push(ev);
}

void metric(std::string_view name, int64_t step, double value) {
    if (!detail::t_recorder) return;
    Name n;
    n.id = intern(name);
    metric(n, step, value);
}

void log(LogLevel level, std::string_view text) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    Event ev;
    ev.log = LogRecord{};
    ev.log.type = EventType::LOG;
    ev.log.level = level;
    ev.log.thread = thread_index();
    ev.log.t_ns = now_ns();
    ev.log.text = new std::string(text);
    r->push(ev);
}

void progress(const ProgressInfo& p) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    Event ev;
    ev.progress = ProgressRecord{};
    ev.progress.type = EventType::PROGRESS;
    ev.progress.t_ns = now_ns();
    ev.progress.tokens_done = p.tokens_done;
    ev.progress.tokens_total = p.tokens_total;
    ev.progress.chunks_done = p.chunks_done;
    ev.progress.chunks_total = p.chunks_total;
    ev.progress.steps_done = p.steps_done;
    ev.progress.steps_total = p.steps_total;
    r->push(ev);
}

void cache_step(int layer, int chunk, int64_t input_pos, int num_tokens, int cache_length,
                std::vector<uint8_t> replay_log, int pass) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    Event ev;
    ev.cache_step = CacheStepRecord{};
    ev.cache_step.type = EventType::CACHE_STEP;
    ev.cache_step.pass = uint8_t(pass < 0 ? 0 : pass > 255 ? 255 : pass);
    ev.cache_step.layer = layer;
    ev.cache_step.chunk = chunk;
    ev.cache_step.num_tokens = num_tokens;
    ev.cache_step.input_pos = input_pos;
    ev.cache_step.cache_length = cache_length;
    ev.cache_step.t_ns = now_ns();
    ev.cache_step.replay_log = new std::vector<uint8_t>(std::move(replay_log));
    r->push(ev);
}

bool wants_full_scores(int chunk) {
    Recorder* r = detail::t_recorder;
    return r && r->wants_full_scores(chunk);
}

void scores(int layer, int chunk, const float* values, int B, int G, int T, int pass) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    const size_t n = (B > 0 && G > 0 && T > 0) ? size_t(B) * size_t(G) * size_t(T) : 0;
    auto* payload = new ScorePayload();
    payload->B = B;
    payload->G = G;
    payload->T = T;
    payload->stats = score_stats(values, values ? n : 0);
    const bool full = values && n > 0 && r->wants_full_scores(chunk);
    if (full) payload->values.assign(values, values + n);
    Event ev;
    ev.scores = ScoresRecord{};
    ev.scores.type = EventType::SCORES;
    ev.scores.pass = uint8_t(pass < 0 ? 0 : pass > 255 ? 255 : pass);
    ev.scores.full = full ? 1 : 0;
    ev.scores.layer = layer;
    ev.scores.chunk = chunk;
    ev.scores.t_ns = now_ns();
    ev.scores.payload = payload;
    r->push(ev);
}

void cell(const CellInfo& c) {
    Recorder* r = detail::t_recorder;
    if (!r) return;
    Event ev;
    ev.cell = CellRecord{};
    ev.cell.type = EventType::CELL;
    ev.cell.device = device_code(c.device);
    ev.cell.row = c.row;
    ev.cell.col = c.col;
    ev.cell.layer_begin = c.layer_begin;
    ev.cell.layer_end = c.layer_end;
    ev.cell.chunk_begin = c.chunk_begin;
    ev.cell.chunk_end = c.chunk_end;
    ev.cell.start_ns = c.start_ns;
    ev.cell.end_ns = c.end_ns;
    ev.cell.peak_bytes = c.peak_bytes;
    r->push(ev);
}

}  // namespace kv::trace
