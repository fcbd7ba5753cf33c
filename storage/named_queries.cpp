// The named queries (see named_queries.h). Their SQL is documented in docs/SESSIONS.md; a
// change to a query's columns is a change to that interface.
#include "named_queries.h"

namespace kv::storage {

namespace {
// Self time per span of run :run in SQL, by the nesting rule of span_summary.h, as CTEs ending
// in `kids(parent, ns)`: the summed duration of each span's direct children. `filter` narrows
// the spans taking part (e.g. to the RUN category for phases). How: each span's open and close
// become events in preorder per thread (closes before opens at the same instant; nested closes
// inner first); the running sum of +1/-1 is a span's depth; the parent of a span at depth d is
// the last span opened at depth d-1 before it -- a running max over (thread, depth) that sees
// each span once at its own depth and once, as a probe, at its parent's. Zero-length spans
// hold no time, so they are left out of the nesting.
std::string children_ctes(const std::string& filter) {
    return "WITH s AS (SELECT id, thread, start_ns AS b, end_ns AS e FROM spans\n"
           "           WHERE run_id = :run AND end_ns > start_ns" +
           filter +
           "),\n"
           "ev AS (SELECT id, thread, b AS t, 1 AS phase, -e AS k1, -id AS k2, 1 AS delta FROM s\n"
           "       UNION ALL SELECT id, thread, e, 0, -b, id, -1 FROM s),\n"
           "lv AS (SELECT id, thread, delta, row_number() OVER w AS seq, sum(delta) OVER w AS depth FROM ev\n"
           "       WINDOW w AS (PARTITION BY thread ORDER BY t, phase, k1, k2 ROWS UNBOUNDED PRECEDING)),\n"
           "opens AS (SELECT id, thread, seq, depth FROM lv WHERE delta = 1),\n"
           "probes AS (SELECT id, thread, seq, depth AS d, 1 AS is_span FROM opens\n"
           "           UNION ALL SELECT id, thread, seq, depth - 1, 0 FROM opens WHERE depth > 1),\n"
           "up AS (SELECT id AS child, thread, is_span, max(CASE WHEN is_span THEN seq END)\n"
           "       OVER (PARTITION BY thread, d ORDER BY seq ROWS UNBOUNDED PRECEDING) AS parent_seq FROM probes),\n"
           "kids AS (SELECT o.id AS parent, sum(s.e - s.b) AS ns FROM up\n"
           "         JOIN opens o ON o.thread = up.thread AND o.seq = up.parent_seq\n"
           "         JOIN s ON s.id = up.child WHERE up.is_span = 0 GROUP BY o.id)\n";
}

const char* const kRunCategory = " AND category = (SELECT id FROM ENUM_KVLAB_SPAN_CATEGORY WHERE name = 'run')";

std::string top_spans_sql() {
    return children_ctes("") +
           "SELECT n.value AS name, c.name AS category, count(*) AS count,\n"
           "       sum(a.end_ns - a.start_ns) / 1e6 AS total_ms,\n"
           "       (sum(a.end_ns - a.start_ns) - sum(coalesce(k.ns, 0))) / 1e6 AS self_ms,\n"
           "       min(a.end_ns - a.start_ns) / 1e6 AS min_ms, max(a.end_ns - a.start_ns) / 1e6 AS max_ms,\n"
           "       avg(a.end_ns - a.start_ns) / 1e6 AS mean_ms\n"
           "FROM spans a LEFT JOIN kids k ON k.parent = a.id JOIN StringIds n ON n.id = a.name_id\n"
           "LEFT JOIN ENUM_KVLAB_SPAN_CATEGORY c ON c.id = a.category\n"
           "WHERE a.run_id = :run GROUP BY a.name_id, a.category\n"
           "ORDER BY self_ms DESC, name, category LIMIT coalesce(:limit, -1)";
}

std::string span_categories_sql() {
    return children_ctes("") +
           "SELECT c.name AS category, count(*) AS count, sum(a.end_ns - a.start_ns) / 1e6 AS total_ms,\n"
           "       (sum(a.end_ns - a.start_ns) - sum(coalesce(k.ns, 0))) / 1e6 AS self_ms\n"
           "FROM spans a LEFT JOIN kids k ON k.parent = a.id LEFT JOIN ENUM_KVLAB_SPAN_CATEGORY c ON c.id = a.category\n"
           "WHERE a.run_id = :run GROUP BY a.category ORDER BY self_ms DESC, category";
}

std::string span_layers_sql() {
    return children_ctes("") +
           "SELECT a.layer AS layer, count(*) AS count, sum(a.end_ns - a.start_ns) / 1e6 AS total_ms,\n"
           "       (sum(a.end_ns - a.start_ns) - sum(coalesce(k.ns, 0))) / 1e6 AS self_ms\n"
           "FROM spans a LEFT JOIN kids k ON k.parent = a.id\n"
           "WHERE a.run_id = :run AND a.layer >= 0 GROUP BY a.layer ORDER BY a.layer";
}

std::string phases_sql() {
    return children_ctes(kRunCategory) +
           ", t AS (SELECT n.value AS phase, count(*) AS count, sum(a.end_ns - a.start_ns) AS total_ns,\n"
           "              sum(a.end_ns - a.start_ns) - sum(coalesce(k.ns, 0)) AS self_ns\n"
           "       FROM spans a LEFT JOIN kids k ON k.parent = a.id JOIN StringIds n ON n.id = a.name_id\n"
           "       WHERE a.run_id = :run" +
           std::string(kRunCategory) +
           " GROUP BY a.name_id)\n"
           "SELECT phase, count, total_ns / 1e6 AS total_ms, self_ns / 1e6 AS self_ms,\n"
           "       100.0 * self_ns / (SELECT total_ns FROM t WHERE phase = 'run') AS self_pct_of_run\n"
           "FROM t ORDER BY self_ms DESC, phase";
}

const char* const kRunsSql =
    "SELECT r.id, r.name, r.status, json_extract(r.config, '$.mode') AS mode,\n"
    "       json_extract(r.config, '$.kv_cache.name') AS policy,\n"
    "       json_extract(r.config, '$.kv_cache.cache_length') AS cache_length,\n"
    "       json_extract(r.config, '$.data.name') AS task,\n"
    "       json_extract(r.config, '$.data.seq_length') AS seq_length,\n"
    "       json_extract(r.summary, '$.tokens_per_s') AS tokens_per_s,\n"
    "       coalesce((SELECT max(value) FROM json_each(r.summary, '$.peak_bytes_without_instrumentation')),\n"
    "                (SELECT max(value) FROM json_each(r.summary, '$.peak_bytes'))) AS peak_bytes\n"
    "FROM (SELECT id, name, status,\n"
    "             CASE WHEN json_valid(config) THEN config ELSE '{}' END AS config,\n"
    "             CASE WHEN json_valid(summary) THEN summary ELSE '{}' END AS summary FROM runs) r\n"
    "ORDER BY r.id";

const char* const kMemorySql =
    "SELECT m.run_id AS run, CASE WHEN m.device < 0 THEN 'cpu' ELSE 'cuda:' || m.device END AS device,\n"
    "       c.name AS category, max(m.category_total) AS peak_bytes, count(*) AS events\n"
    "FROM memory_events m LEFT JOIN ENUM_KVLAB_MEM_CATEGORY c ON c.id = m.category\n"
    "WHERE :run IS NULL OR m.run_id = :run\n"
    "GROUP BY m.run_id, m.device, m.category ORDER BY run, m.device, peak_bytes DESC, category";

// Chunk numbers restart with every sample and cache_steps has no sample column: the k-th row of
// a (pass, layer, chunk) in write order belongs to sample k.
const char* const kEvictionsSql =
    "SELECT sample, pass, chunk, min(input_pos) AS input_pos, max(num_tokens) AS tokens,\n"
    "       max(cache_length) AS cache_length, count(*) AS layers, sum(evicted) AS evicted,\n"
    "       max(evicted) AS evicted_max_layer\n"
    "FROM (SELECT row_number() OVER (PARTITION BY pass, layer, chunk ORDER BY id) - 1 AS sample,\n"
    "             pass, chunk, input_pos, num_tokens, cache_length,\n"
    "             CASE WHEN cache_length <= 0 THEN 0\n"
    "                  ELSE min(input_pos, cache_length) + num_tokens - min(input_pos + num_tokens, cache_length) END\n"
    "             AS evicted\n"
    "      FROM cache_steps WHERE run_id = :run)\n"
    "GROUP BY sample, pass, chunk ORDER BY sample, pass, chunk";

const char* const kMetricsSql =
    "SELECT m.name, count(*) AS count, min(m.value) AS min, max(m.value) AS max,\n"
    "       (SELECT l.value FROM metrics l WHERE l.run_id = m.run_id AND l.name = m.name\n"
    "        ORDER BY l.step DESC, l.id DESC LIMIT 1) AS last, max(m.step) AS last_step\n"
    "FROM metrics m WHERE m.run_id = :run GROUP BY m.name ORDER BY m.name";

const NamedQueryParam kRun{"run", true, "run id"};
}  // namespace

const std::vector<NamedQuery>& named_queries() {
    static const std::vector<NamedQuery> queries = {
        {"runs", "every run: id, name, status, mode, policy, cache length, task, tokens/s, peak bytes", {}, kRunsSql},
        {"top-spans",
         "time per span name and category in a run, by self time (total minus child spans)",
         {kRun, {"limit", false, "at most this many rows"}},
         top_spans_sql()},
        {"span-categories",
         "time per span category in a run, by self time (total minus child spans)",
         {kRun},
         span_categories_sql()},
        {"span-layers",
         "time per model layer in a run: the spans tagged with each layer, total and self time",
         {kRun},
         span_layers_sql()},
        {"phases",
         "a run's phases (RUN-category spans): self time each; the 'run' row's self time is unattributed time",
         {kRun},
         phases_sql()},
        {"memory-by-category",
         "peak bytes per memory category and device of each run (or of --run)",
         {{"run", false, "only this run"}},
         kMemorySql},
        {"evictions-per-chunk",
         "tokens each chunk of each sample evicted: occupancy before + new tokens - cache length, per layer",
         {kRun},
         kEvictionsSql},
        {"metrics", "a run's metric names with count, min, max and the last value (by step)", {kRun}, kMetricsSql},
    };
    return queries;
}

const NamedQuery* find_named_query(const std::string& name) {
    for (const auto& q : named_queries())
        if (q.name == name) return &q;
    return nullptr;
}

}  // namespace kv::storage
