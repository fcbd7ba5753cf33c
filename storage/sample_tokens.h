// The sample_tokens table (schema v4): one row per evaluated sample with its token ids, the
// tokenizer's pieces and the per-position loss, each as one BLOB, so a sample of any length is
// one INSERT (the cost of the per-token record is a single row per sample, not a row per token).
// IF NOT EXISTS: a file set back to an older version number (as tests do) may hold the table.
// Blob layouts (little-endian, what SQL readers need to decode them):
//   ids        int32 per token (T * 4 bytes)
//   pieces     the pieces' bytes back to back; piece_ends holds uint32 end offsets (T * 4 bytes)
//   loss       float32 per input position (T * 4 bytes), NaN where nothing was scored
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "storage/sqlite_util.h"

#define KVLAB_SAMPLE_TOKENS_SQL                                                                         \
    "CREATE TABLE IF NOT EXISTS sample_tokens(id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, sample INTEGER NOT NULL, " \
    "description TEXT NOT NULL, tokens INTEGER NOT NULL, ids BLOB, pieces BLOB, piece_ends BLOB, loss BLOB, " \
    "mean_loss REAL, scored INTEGER NOT NULL, correct INTEGER NOT NULL, token_accuracy REAL NOT NULL);\n" \
    "CREATE INDEX IF NOT EXISTS sample_tokens_run ON sample_tokens(run_id, sample);\n"

namespace kv::storage {

// Inserts one row (one statement; the caller's connection and transaction rules apply).
// Throws SessionError(INVALID) when pieces or loss are neither empty nor one per id.
void insert_sample_tokens(Db& db, int64_t run, const SampleTokensRow& row);
// Rows of `run` with id > after_id, by id. `with_pieces` false skips decoding the text.
std::vector<SampleTokensRow> select_sample_tokens(Db& db, int64_t run, int64_t after_id, bool with_pieces = true);

// The blobs as stored (exposed for tests and exports).
std::vector<uint8_t> encode_piece_ends(const std::vector<std::string>& pieces, std::string* bytes);
// Splits `bytes` at `ends`; throws SessionError(DAMAGED) when the offsets do not fit.
std::vector<std::string> decode_pieces(const void* bytes, size_t n, const void* ends, size_t ends_bytes);

}  // namespace kv::storage
