// The redundancy pass of rkv over a matrix of key similarities, at the CPU's vector width.
#pragma once

#include <cstdint>

namespace kv {

// Columns [0, n) of rows [0, rows) of a similarity matrix S (row stride ld): column c is slot
// c0 + c, row j slot j at position pos[j]. For every column, over the rows j in order, skipping
// its own row (j == c0 + c): v = double(S[j][c]); sum[c] += v; where v > threshold and
// pos[j] > newest[c], newest[c] = pos[j] and exempt[c] = v (the newest similar key so far).
// sum, newest and exempt are read and written (start them at 0, -1, 0); the self row adds +0,
// as the plain loop does. Each column is its own chain in row order, so every level gives the
// bits of the plain loop.
void policy_similarity_columns(const float* S, int64_t ld, int64_t rows, int64_t n, int64_t c0, const int32_t* pos, double threshold,
                               double* sum, double* newest, double* exempt);
// The same at ISA level `level` or the best below it this CPU runs (policy_matmul_level's
// scale), for tests of every path.
void policy_similarity_columns_at(int level, const float* S, int64_t ld, int64_t rows, int64_t n, int64_t c0, const int32_t* pos,
                                  double threshold, double* sum, double* newest, double* exempt);

}  // namespace kv
