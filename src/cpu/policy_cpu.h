// Host policy of the CPU kernels: the thresholds that choose a path and the
// fixed partitions of the work, apart from the loops that follow them. The
// partitions depend on the shape only, never on the thread count: See Note
// [Determinism]. The thresholds were fitted on 2 cores (docs/PERFORMANCE_LEDGER.md, CPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "dirmult/math.h"

#include "shared_rows_avx2.h"

namespace dirmult {
namespace cpu {

// --- Shared-alpha lookup tables (See Note [Tables]).

// Rows from which the tables are built: a column's table (one run of running
// products, 16 logs) costs about what 4-6 rows of direct evaluations do.
constexpr int64_t kTableMinRows = 6;

// Rows from which every entry is built. Below, one pass over the counts finds
// each column's largest count and the table is built up to it where it pays
// (table_pays): from about this many rows most columns hold their largest
// possible count, and that pass would cost more than the entries it saves.
constexpr int64_t kTopsMaxRows = 64;

// Whether a table of `entries` entries over V columns costs less than the
// math path's `nonzero` evaluations, one per nonzero count. vector_math: the
// rows' math path takes eight counts at a time (vector_math_path), ~4x
// faster per count, so the table must save more.
inline bool table_pays(int64_t entries, int64_t V, int64_t nonzero, bool vector_math) {
  return vector_math ? entries + V <= nonzero : 2 * (entries + V) <= 3 * nonzero;
}

// Whether the shared-alpha math path takes eight counts at a time
// (lnp_row_sums with shared_lnpoch8_avx2): float32 on a CPU with AVX2.
template <typename scalar_t>
bool vector_math_path() {
  return std::is_same_v<scalar_t, float> && cpu::shared_rows_avx2_available();
}

// --- Scheduling: how much work a parallel task gets at least. Unlike the
// partitions below, the results do not depend on it.

// The least work, in counts (nonzeros, columns, table entries), of a task of
// a parallel loop; a loop with less runs on the calling thread. See Note
// [Parallel grain].
constexpr int64_t kMinTaskWork = int64_t{1} << 17;

// The grain of a parallel loop over items of work_per_item each: at least
// min_grain items and kMinTaskWork of work per task.
inline int64_t parallel_grain(int64_t work_per_item, int64_t min_grain = 1) {
  const int64_t w = std::max<int64_t>(work_per_item, 1);
  return std::max<int64_t>(min_grain, (kMinTaskWork + w - 1) / w);
}

// A CSR row's work for parallel_grain: its nonzeros' terms and its finish
// (the row total's lnpoch, about 16 nonzeros' worth), for each of K components.
inline int64_t csr_row_work(int64_t nnz, int64_t B, int64_t K) {
  return K * (nnz / std::max<int64_t>(B, 1) + 16);
}

// Whether the CSR forward reads lnpoch of small counts from a table (See
// Note [CSR tables]): its 16 V K entries cost about an lnpoch each, so the
// nonzeros must outnumber them, and it must stay within the caches' reach.
constexpr int64_t kCsrTableMaxBytes = int64_t{16} << 20;

inline bool csr_forward_uses_table(int64_t nnz, int64_t V, int64_t K, size_t elem_bytes) {
  const int64_t entries = V * K * kMaxExactCount;
  return nnz * K >= 2 * entries &&
         entries * static_cast<int64_t>(elem_bytes) <= kCsrTableMaxBytes;
}

// --- Fixed partitions (See Note [Determinism]).

// Row blocks of the CSR single pass, each with its own V column sums:
// at most this many (log_lik_csr_with_grad_cpu.cpp).
constexpr int64_t kCsrGradBlocks = 64;

// Columns per block of the concentration total A's partial sums.
constexpr int64_t kAlphaSumBlock = 4096;

// With fewer rows than kRowsForRowsOnly, each row is split into chunks of
// kColumnChunk columns (the items run in parallel; a row's chunks are added
// in order), so that a few long rows still use every thread.
constexpr int64_t kRowsForRowsOnly = 64;
constexpr int64_t kColumnChunk = 16384;

// Column chunks per row (1: rows are the work items).
inline int64_t row_chunks(int64_t B, int64_t V) {
  return B < kRowsForRowsOnly ? std::max<int64_t>(1, (V + kColumnChunk - 1) / kColumnChunk) : 1;
}

// Whether the rows are split into column chunks, where the shared-alpha
// backward sums its columns in parallel instead of its rows
// (backward_shared_few_rows) and log_lik_with_grad takes the forward and
// the backward (See Note [Single pass]).
inline bool few_long_rows(int64_t B, int64_t V) {
  return B < kRowsForRowsOnly && V > kColumnChunk;
}

// Blocks of rows whose column gradients the shared-alpha backward sums
// apart, then adds in order: up to 64 of at least 256 rows, their partial
// sums (blocks x V doubles) at most 2^23 values.
inline int64_t gradient_row_blocks(int64_t B, int64_t V) {
  const int64_t max_blocks = std::max<int64_t>(1, (int64_t{1} << 23) / std::max<int64_t>(V, 1));
  return std::max<int64_t>(1, std::min<int64_t>({(B + 255) / 256, 64, max_blocks}));
}

// --- log_lik_regression (See Note [Regression fusion]).

// Rows whose log_alpha (and, in the backward, gradient G) the regression
// makes at once: one block of kRegressionBlockRows x V scalars each per task
// (32 x 1024 float32: 128 KiB, within L2), so each row of W is read once per
// block and the products X W, G W^T and X^T G run as register tiles.
constexpr int64_t kRegressionBlockRows = 32;

// Blocks of rows whose dW and dbias partials the regression's backward sums
// apart, then adds in order: up to 64 of at least 256 rows, their partials
// (blocks x (P + 1) x V doubles) at most 2^22 values. The shape alone fixes
// them, never the thread count.
inline int64_t regression_row_blocks(int64_t B, int64_t P, int64_t V) {
  const int64_t per_block = (P + 1) * std::max<int64_t>(V, 1);
  const int64_t max_blocks = std::max<int64_t>(1, (int64_t{1} << 22) / per_block);
  return std::max<int64_t>(1, std::min<int64_t>({(B + 255) / 256, 64, max_blocks}));
}

}  // namespace cpu
}  // namespace dirmult
