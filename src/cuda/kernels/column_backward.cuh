// Backward kernels.
//
// Shared alpha / components (one read of the counts):
//   grad_la[k, v] = sum_b G[b,k] adpoch(a_kv, n_bv) - a_kv * S_k,
//   S_k = sum_b G[b,k] dpoch(A_k, N_b).
// column_backward_kernel: a block owns 1024 columns x a tile of rows; each
//   thread keeps its 4 columns' alpha and sums in registers down the rows
//   (column sums need no cross-thread traffic); each warp writes its part of
//   the row totals N_b, summed in a fixed order by row_weights_kernel.
// row_weights_kernel: w[b,k] = G[b,k] dpoch(A_k, N_b), summed per block.
// column_finish_kernel: S_k = sum_b w[b,k]; grad = sum_tiles C - a S.
// Every reduction has a shape-determined order: bitwise reproducible.
//
// zero_weight_rows (shared and component alpha, CPU too): a row whose
// incoming gradient is exactly 0 does not enter the gradient, even with bad
// counts (no 0 * NaN), and column_backward_kernel does not read batches of
// such rows (8 consecutive rows of weight 0 are skipped unread: a mask
// that drops runs of rows saves their reads).
#pragma once

#include "alpha_prep.cuh"
#include "spread_marks.cuh"
#include "table_layout.cuh"
#include "table_lookup.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

constexpr int kColThreads = 256;
constexpr int kColsPerBlock = 4 * kColThreads;
constexpr int kColWarps = kColThreads / 32;
constexpr int kRowBatch = 8;  // rows whose loads are in flight together

struct ColumnTiling {
  int64_t col_chunks;
  int64_t rows_per_tile;
  int64_t row_tiles;
};

// A thread's 4 columns (base = counts + v0, v_end = columns left from v0)
// of the kRowBatch rows from b0, zeros past b_end and past V; all loads
// issued before any is used, so they are in flight together.
template <typename scalar_t, typename count_t>
__device__ __forceinline__ void load_row_batch(const count_t* __restrict__ base, int64_t V,
                                               int64_t b0, int64_t b_end, int64_t v_end,
                                               bool aligned, scalar_t (&n)[kRowBatch][4],
                                               double (&exact)[kRowBatch][4]) {
#pragma unroll
  for (int i = 0; i < kRowBatch; ++i) {
    if (b0 + i < b_end && v_end > 0) {
      load_counts<scalar_t, count_t>(base + (b0 + i) * V, 0, v_end, aligned, n[i], exact[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) n[i][j] = scalar_t(0), exact[i][j] = 0.0;
    }
  }
}

// grid (col_chunks, row_tiles, ceil(K / KB)).
// Cpart: (row_tiles, K, V) column partials. Npart: (B, col_chunks, kColWarps)
// row totals, a warp's 128 columns each (written by the blocks with
// blockIdx.z == 0; NaN marks a bad count). Warps never wait for each other
// after the table is staged: no block-wide reduction in the row loop.
// kTable (float, K == 1): adpoch of small integer counts comes from adp_table
// (See Note [Tables]), staged in shared memory for the block's columns;
// the hot loop is branch-free as in forward_table_kernel.
template <typename scalar_t, typename count_t, int KB, bool kTable>
__global__ void __launch_bounds__(kColThreads, kTable ? 3 : 1)
    column_backward_kernel(const scalar_t* __restrict__ grad, const count_t* __restrict__ counts,
                           const ColumnAlpha<scalar_t>* __restrict__ cols,
                           const float* __restrict__ adp_table, int64_t B, int64_t V, int K,
                           ColumnTiling tiling, bool aligned, double* __restrict__ Cpart,
                           double* __restrict__ Npart) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t chunk0 = blockIdx.x * static_cast<int64_t>(kColsPerBlock);
  const int64_t v0 = chunk0 + 4 * t;
  const int64_t b_begin = blockIdx.y * tiling.rows_per_tile;
  const int64_t b_end = min(B, b_begin + tiling.rows_per_tile);
  const int kb = blockIdx.z * KB;
  const bool row_totals = blockIdx.z == 0;
  const int64_t n_parts = tiling.col_chunks * kColWarps;  // Npart entries per row

  extern __shared__ float adp_tab[];
  if constexpr (kTable) {
    static_assert(kColsPerBlock == kTableChunk, "the table slot layout is per 1024 columns");
    stage_table_slice(adp_tab, adp_table, blockIdx.x);  // columns past V: entry 0 (= 0)
  }

  ColumnAlpha<scalar_t> col[KB][4];
#pragma unroll
  for (int k = 0; k < KB; ++k) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool in = kb + k < K && v0 + j < V;
      col[k][j] = in ? cols[(kb + k) * V + v0 + j] : ColumnAlpha<scalar_t>{1, 0, 1, 1};
    }
  }
  double acc[KB][4];
#pragma unroll
  for (int k = 0; k < KB; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[k][j] = 0.0;

  const count_t* base = counts + v0;
  const int64_t v_end = V - v0;  // columns left from v0
  // table_slot(4 t + j, n) = n * 1024 + j * 256 + t, read through its 32-bit
  // shared address (table_entry_at).
  const unsigned tq_at = static_cast<unsigned>(__cvta_generic_to_shared(adp_tab + t));
  for (int64_t b0 = b_begin; b0 < b_end; b0 += kRowBatch) {
    // A batch of rows whose incoming gradients are all 0 (every component:
    // the row totals serve them all) is not read: zero_weight_rows.
    // The batch's gradients are grad[b0 K, min(b_end, b0 + kRowBatch) K).
    bool zero_batch = true;
    if constexpr (kTable) {  // K == 1: unrolled, non-short-circuit: the loads issue together
#pragma unroll
      for (int i = 0; i < kRowBatch; ++i) {
        zero_batch &= b0 + i >= b_end || grad[b0 + i] == scalar_t(0);
      }
    } else {
      const int64_t g_end = min(b_end, b0 + kRowBatch) * K;
#pragma unroll 1
      for (int64_t i = b0 * K; i < g_end; ++i) zero_batch &= grad[i] == scalar_t(0);
    }
    if (zero_batch) {
      if (row_totals && lane == 0) {
        for (int64_t b = b0; b < min(b_end, b0 + kRowBatch); ++b) {
          Npart[b * n_parts + blockIdx.x * kColWarps + warp] = 0.0;
        }
      }
      continue;
    }
    scalar_t n[kRowBatch][4];
    double exact[kRowBatch][4];
    load_row_batch(base, V, b0, b_end, v_end, aligned, n, exact);
    unsigned rare = 0;  // kTable: counts off the table, bit 4 i + j
    float acc_batch[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // kTable: this batch's terms
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      const int64_t b = b0 + i;
      // This thread's part of N_b: table indices as integers, every other
      // count in float64 (NaN for a bad one).
      int table_n = 0;
      double other_n = 0.0;
      if constexpr (kTable) {
        const float g = b < b_end ? static_cast<float>(grad[b * K]) : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int idx;
          const bool hit = table_index(n[i][j], idx);
          idx = hit ? idx : 0;
          table_n += idx;
          rare |= hit ? 0u : 1u << (4 * i + j);
          const float d = load_shared_float(table_entry_at(tq_at, idx, j * (kTableChunk / 4)));
          acc_batch[j] = fmaf(g, d, acc_batch[j]);
        }
      } else {
        double g[KB];
#pragma unroll
        for (int k = 0; k < KB; ++k) {
          g[k] = b < b_end ? static_cast<double>(grad[b * K + min(kb + k, K - 1)]) : 0.0;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const scalar_t x = n[i][j];
          if (x == scalar_t(0)) continue;
          other_n += is_valid_count(x) ? exact[i][j] : NAN;
#pragma unroll
          for (int k = 0; k < KB; ++k) {  // (a zero-weight row's bad count stays out)
            const double d = static_cast<double>(adpoch(col[k][j].factors(), col[k][j].a, x));
            acc[k][j] += g[k] == 0.0 ? 0.0 : g[k] * d;
          }
        }
      }
      if (row_totals && b0 + i < b_end) {
        double total = static_cast<double>(__reduce_add_sync(0xffffffffu, table_n));
        if constexpr (kTable) {
          // A warp-uniform branch, rarely taken: the row's counts off the
          // table, exactly, from memory (float64 counts are not exact in float).
          const unsigned row_rare = (rare >> (4 * i)) & 0xFu;
          if (__any_sync(0xffffffffu, row_rare != 0)) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if ((row_rare >> j) & 1u) {
                other_n += is_valid_count(n[i][j]) ? static_cast<double>(base[b * V + j]) : NAN;
              }
            }
            total += warp_sum(other_n);
          }
        } else {
          if (__any_sync(0xffffffffu, !(other_n == 0.0))) total += warp_sum(other_n);
        }
        if (lane == 0) Npart[b * n_parts + blockIdx.x * kColWarps + warp] = total;
      }
    }
    if constexpr (kTable) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][j] += static_cast<double>(acc_batch[j]);
      // Non-integer, large or bad counts: one rolled copy of the math path,
      // out of the unrolled loops (copies in them overflowed the instruction
      // cache). Bad counts are already NaN in N_b, which poisons the gradient.
      // Spread over the warp's lanes (spread_marks).
      if (__any_sync(0xffffffffu, rare != 0)) {
        struct Term {
          double d;
          int valid, unused;
        };
        auto compute = [&](int owner, int e) {
          const int i = e >> 2, j = e & 3;
          const int64_t v = 4 * (owner - lane) + j;  // the owner's column, from v0
          const scalar_t x = static_cast<scalar_t>(base[(b0 + i) * V + v]);
          if (!is_valid_count(x)) return Term{0.0, 0, 0};
          const ColumnAlpha<scalar_t> cl = cols[v0 + v];
          return Term{static_cast<double>(grad[(b0 + i) * K]) *
                          static_cast<double>(adpoch(cl.factors(), cl.a, x)),
                      1, 0};
        };
        auto consume = [&](int e, const Term& r) {
          const int j = e & 3;
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) acc[0][jj] += r.valid && jj == j ? r.d : 0.0;
        };
        spread_marks<Term>(rare, compute, consume);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < KB; ++k) {
    if (kb + k >= K) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (v0 + j < V) Cpart[(blockIdx.y * static_cast<int64_t>(K) + kb + k) * V + v0 + j] = acc[k][j];
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
