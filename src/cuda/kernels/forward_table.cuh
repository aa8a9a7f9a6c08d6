// forward_table_kernel: the shared-alpha float32 forward with the lookup
// table (See Note [Tables]), a warp per row, rows in registers.
#pragma once

#include "alpha_prep.cuh"
#include "dependent_launch.cuh"
#include "rare_counts.cuh"
#include "row_chunks.cuh"
#include "table_fill.cuh"
#include "table_layout.cuh"
#include "table_lookup.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// A warp's rows in forward_table_kernel, one after the other: add()
// reduces a row's sums over the warp; with one chunk per row, lane i % 32
// keeps the warp's i-th row and finishes it (float64 lnpoch(A, N)) once 32
// rows are in, so that the finish runs for 32 rows at once, and flush()
// finishes the rest; with several chunks, lane 0 writes the chunk's partial.
// Warp-uniform calls only. The kernel's parameters (RowOut) are passed to
// each call rather than kept in the writer: read from the constant bank
// where needed, they hold no registers in the hot loops.
struct RowOut {
  int64_t num_chunks;
  bool normalize;
  float* __restrict__ out;
  RowPartial* __restrict__ partial;
};

struct TableRowWriter {
  int64_t my_b = -1;
  double my_s = 0.0, my_N = 0.0, my_norm = 0.0;
  int i = 0;

  // s: the lane's lnpoch sum; table_N its table counts (exact integers),
  // rare_N and norm its off-table counts and -log n! terms; ok: no bad count.
  // c: the chunk (with several, the partial's column).
  __device__ __forceinline__ void add(const RowOut& o, double log_A, int64_t b, int64_t c,
                                      bool valid, double s, int table_N, double rare_N,
                                      double norm, bool ok) {
    const int lane = threadIdx.x & 31;
    s = warp_allsum(s);
    double N = static_cast<double>(__reduce_add_sync(0xffffffffu, table_N));
    if (__any_sync(0xffffffffu, rare_N != 0.0 || norm != 0.0)) {
      N += warp_allsum(rare_N);
      norm = warp_allsum(norm);
    }
    if (!__all_sync(0xffffffffu, ok)) s = NAN;
    if (!valid) return;
    if (o.num_chunks > 1) {
      if (lane == 0) o.partial[b * o.num_chunks + c] = {s, N, norm, 0.0};
      return;
    }
    if ((i & 31) == lane) my_b = b, my_s = s, my_N = N, my_norm = norm;
    if ((i & 31) == 31) flush(o, log_A);
    ++i;
  }

  __device__ __forceinline__ void flush(const RowOut& o, double log_A) {
    if (my_b >= 0) {
      o.out[my_b] = static_cast<float>(finish_row(my_s, my_N, my_norm, log_A, o.normalize));
    }
    my_b = -1;
  }
};

// The lane's 4 * kUnroll counts from column v0 + base of rows b0 + r * stride
// (r < kRows); rows past B read as zeros.
template <typename count_t, int kRows, int kUnroll>
__device__ __forceinline__ void load_table_batch(const count_t* __restrict__ counts, int64_t b0,
                                                 int64_t stride, int64_t B, int64_t V, int64_t v0,
                                                 int base, int len, bool aligned,
                                                 float4 (&n)[kRows][kUnroll]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const count_t* row = counts + (b0 + r * stride) * V + v0;
    const bool in = b0 + r * stride < B;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[4];
      double unused[4];
      load_counts<float, count_t>(row, base + 128 * u, in ? len : 0, aligned, x, unused);
      n[r][u] = make_float4(x[0], x[1], x[2], x[3]);
    }
  }
}

// Forward with the table: grid (column chunks, row groups), a warp per row.
// Each block holds its chunk's slice of the table in shared memory. The
// per-row float64 finish (lnpoch(A, N), log N!) is done for 32 rows at once,
// a row per lane, instead of by lane 0 alone.
//
// The hot loop is branch-free: a zero count looks up entry 0 (which is 0),
// the table index of a count off the table is replaced by 0 and the count is
// marked rare; N sums the table indices as integers (one warp reduction
// instruction per row) and the rare counts exactly, in float64. Validity
// needs checking only for rare counts (every table index is a valid count).
//
// kRows rows per warp are in flight at once (their loads are all issued
// before any is used): more bytes in flight per SM at fewer resident blocks.
//
// Launched as a dependent of prep_and_table_kernel (launch_dependent), so its
// launch overlaps the table's preparation. (Prefetching the first rows to L2
// before the wait was slower: docs/PERFORMANCE_LEDGER.md.)
//
// kFill: the block fills its table slice itself from log_alpha
// (fill_table_slice; `table` is unused) while its first rows' loads are in
// flight, and the kernel waits for the prior grid (alpha_prep_kernel: cols
// and Apart) only after that, so the fill overlaps both.
template <typename count_t, int kRows, bool kFill = false>
__global__ void __launch_bounds__(kRowWarps * 32, kRows == 1 && !kFill ? 3 : 2)
    forward_table_kernel(const count_t* __restrict__ counts, const float* __restrict__ table,
                         const float* __restrict__ log_alpha,
                         const ColumnAlpha<float>* __restrict__ cols,
                         const double* __restrict__ Apart, int nblk_alpha, int64_t B, int64_t V,
                         bool aligned, const RowOut o) {
  const bool normalize = o.normalize;
  // 8-byte counts: half the loads in flight, or their registers spill.
  constexpr int kUnroll = sizeof(count_t) > 4 ? kTableUnroll / 2 : kTableUnroll;
  extern __shared__ float tab[];
  const int64_t c = blockIdx.x;
  const int64_t v0 = c * kTableChunk;
  const int len = static_cast<int>(min(V - v0, static_cast<int64_t>(kTableChunk)));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kRowWarps;  // between a warp's rows
  // A warp's steps: kRows rows (b0) by pieces of kUnroll * 128 columns
  // (warp-uniform: lanes past len load zeros, entry 0).
  const int pieces = (len + 128 * kUnroll - 1) / (128 * kUnroll);
  int64_t b0 = static_cast<int64_t>(blockIdx.y) * kRowWarps + warp;
  int piece = 0;
  float4 n[kRows][kUnroll];
  // Columns past V read as count 0: entry 0 (= 0).
  if constexpr (kFill) {
    SliceAlpha<kRowWarps * 32> alpha;
    alpha.load(log_alpha, V, c);  // (before the rows: not served behind them)
    load_table_batch<count_t, kRows, kUnroll>(counts, b0, stride, B, V, v0, 4 * lane, len,
                                              aligned, n);
    fill_table_slice(tab, alpha, V, c, normalize);
    wait_for_prior_grid();
  } else {
    wait_for_prior_grid();
    stage_table_slice(tab, table, c);
  }
  const double log_A = alpha_log_total<float>(Apart, 0, nblk_alpha);
  TableRowWriter writer;
  double s[kRows], rare_N[kRows], norm[kRows];
  int table_N[kRows];  // at most kMaxExactCount per column: no overflow
  bool ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = rare_N[r] = norm[r] = 0.0, table_N[r] = 0, ok[r] = true;
  while (b0 < B) {
    const int base = piece * (128 * kUnroll) + 4 * lane;
    if constexpr (!kFill) {  // (kFill: loaded after the previous step)
      load_table_batch<count_t, kRows, kUnroll>(counts, b0, stride, B, V, v0, base, len, aligned,
                                                n);
    }
    const float* tq = tab + (base >> 2);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const unsigned rare = add_table_terms<kUnroll>(n[r], tq, s[r], table_N[r]);
      add_rare_terms(rare, counts + (b0 + r * stride) * V + v0, base, cols + v0, normalize, s[r],
                     rare_N[r], norm[r], ok[r]);
    }
    if (++piece == pieces) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t b = b0 + r * stride;
        writer.add(o, log_A, b, c, b < B, s[r], table_N[r], rare_N[r], norm[r], ok[r]);
        s[r] = rare_N[r] = norm[r] = 0.0, table_N[r] = 0, ok[r] = true;
      }
      piece = 0;
      b0 += kRows * stride;
    }
    if constexpr (kFill) {
      if (b0 < B) {
        load_table_batch<count_t, kRows, kUnroll>(counts, b0, stride, B, V, v0,
                                                  piece * (128 * kUnroll) + 4 * lane, len,
                                                  aligned, n);
      }
    }
  }
  writer.flush(o, log_A);
}

}  // namespace cuda
}  // namespace dirmult
