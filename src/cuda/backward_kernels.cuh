// Backward kernels.
//
// Shared alpha / components (one read of the counts):
//   grad_la[k, v] = sum_b G[b,k] adpoch(a_kv, n_bv) - a_kv * S_k,
//   S_k = sum_b G[b,k] dpoch(A_k, N_b).
// column_backward_kernel: a block owns 1024 columns x a tile of rows; each
//   thread keeps its 4 columns' alpha and sums in registers down the rows
//   (column sums need no cross-thread traffic), while the row totals N_b are
//   reduced across the block in batches of 8 rows, in a fixed order.
// row_weights_kernel: w[b,k] = G[b,k] dpoch(A_k, N_b).
// column_finish_kernel: S_k = sum_b w[b,k]; grad = sum_tiles C - a S.
// Every reduction has a shape-determined order: bitwise reproducible.
//
// Per-sample alpha and the counts gradient are elementwise once the row
// totals are known: row_totals_kernel, then elementwise_backward_kernel.
#pragma once

#include "alpha_prep.cuh"
#include "cuda_utils.cuh"
#include "dirmult/math.h"
#include "table_kernels.cuh"

namespace dirmult {
namespace cuda {

constexpr int kColThreads = 256;
constexpr int kColsPerBlock = 4 * kColThreads;
constexpr int kRowBatch = 8;  // rows reduced together (== warps per block)
constexpr int kMaxExactCount1 = kMaxExactCount + 1;  // lookup-table width

struct ColumnTiling {
  int64_t col_chunks;
  int64_t rows_per_tile;
  int64_t row_tiles;
};

inline ColumnTiling tile_columns(int64_t B, int64_t V, int64_t k_blocks) {
  const int64_t col_chunks = ceil_div(V, kColsPerBlock);
  // About 512 blocks in all; a tile is a multiple of the row batch.
  const int64_t tiles = std::max<int64_t>(1, 512 / (col_chunks * k_blocks));
  int64_t rows = ceil_div(ceil_div(std::max<int64_t>(B, 1), tiles), kRowBatch) * kRowBatch;
  rows = std::max<int64_t>(rows, kRowBatch);
  return {col_chunks, rows, ceil_div(std::max<int64_t>(B, 1), rows)};
}

// grid (col_chunks, row_tiles, ceil(K / KB)).
// Cpart: (row_tiles, K, V) column partials. Npart: (B, col_chunks) row totals
// (written by the blocks with blockIdx.z == 0; NaN marks a bad count).
// kTable (float, K == 1): adpoch of small integer counts comes from adp_table
// (see table_kernels.cuh), staged in shared memory for the block's columns.
template <typename scalar_t, typename count_t, int KB, bool kTable>
__global__ void __launch_bounds__(kColThreads)
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

  extern __shared__ float adp_tab[];
  if constexpr (kTable) {
    static_assert(kColsPerBlock == kTableChunk, "the table slot layout is per 1024 columns");
    const int len = static_cast<int>(min(V - chunk0, static_cast<int64_t>(kColsPerBlock))) *
                    kMaxExactCount1;
    for (int i = t; i < len; i += blockDim.x) {
      const int v = i / kMaxExactCount1;
      adp_tab[table_slot(v, i - v * kMaxExactCount1)] = adp_table[chunk0 * kMaxExactCount1 + i];
    }
    __syncthreads();
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

  __shared__ double row_sums[kRowBatch][kColThreads];
  const count_t* base = counts + v0;
  const int64_t v_end = V - v0;  // columns left from v0
  for (int64_t b0 = b_begin; b0 < b_end; b0 += kRowBatch) {
    // All the batch's loads first, so several are in flight per thread.
    scalar_t n[kRowBatch][4];
    double row_n[kRowBatch];
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      const int64_t b = b0 + i;
      row_n[i] = 0.0;
      if (b < b_end && v_end > 0) {
        double exact[4];
        load_counts<scalar_t, count_t>(base + b * V, 0, v_end, aligned, n[i], exact);
        bool ok = true;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          row_n[i] += exact[j];
          ok = ok && (n[i][j] == scalar_t(0) || is_valid_count(n[i][j]));
        }
        if (!ok) row_n[i] = NAN;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) n[i][j] = scalar_t(0);
      }
    }
    unsigned rare = 0;  // kTable: counts off the table, bit 4 i + j
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      const int64_t b = b0 + i;
      if (b >= b_end) break;
      double g[KB];
#pragma unroll
      for (int k = 0; k < KB; ++k) g[k] = static_cast<double>(grad[b * K + min(kb + k, K - 1)]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const scalar_t x = n[i][j];
        if (x == scalar_t(0)) continue;
        if constexpr (kTable) {
          int idx;
          if (table_index(x, idx)) {
            acc[0][j] += g[0] * static_cast<double>(adp_tab[table_slot(4 * t + j, idx)]);
          } else if (is_valid_count(x)) {
            rare |= 1u << (4 * i + j);
          }
          continue;
        }
#pragma unroll
        for (int k = 0; k < KB; ++k) {
          acc[k][j] += g[k] * static_cast<double>(adpoch(col[k][j].factors(), col[k][j].a, x));
        }
      }
    }
    if constexpr (kTable) {
      // Non-integer or large counts: one rolled copy of the math path, out
      // of the unrolled loops (copies in them overflowed the instruction cache).
#pragma unroll 1
      while (rare != 0) {
        const int e = __ffs(static_cast<int>(rare)) - 1;
        rare &= rare - 1;
        const int i = e >> 2, j = e & 3;
        const scalar_t x = static_cast<scalar_t>(base[(b0 + i) * V + j]);
        const ColumnAlpha<scalar_t> cl = cols[v0 + j];
        const double d = static_cast<double>(grad[(b0 + i) * K]) *
                         static_cast<double>(adpoch(cl.factors(), cl.a, x));
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[0][jj] += jj == j ? d : 0.0;
      }
    }
    if (row_totals) {
#pragma unroll
      for (int i = 0; i < kRowBatch; ++i) row_sums[i][t] = row_n[i];
      __syncthreads();
      // Warp w reduces row b0 + w over the block's threads, in a fixed order.
      double s = 0.0;
#pragma unroll
      for (int m = 0; m < kColThreads / 32; ++m) s += row_sums[warp][lane + 32 * m];
      s = warp_sum(s);
      if (lane == 0 && b0 + warp < b_end) Npart[(b0 + warp) * tiling.col_chunks + blockIdx.x] = s;
      __syncthreads();
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

// w[b, k] = G[b, k] * dpoch(A_k, N_b), N_b summed over column chunks in a
// fixed order; one warp per (b, k).
template <typename scalar_t>
__global__ void __launch_bounds__(256)
    row_weights_kernel(const scalar_t* __restrict__ grad, const double* __restrict__ Npart,
                       int64_t col_chunks, const double* __restrict__ Apart, int nblk_alpha,
                       int64_t B, int K, double* __restrict__ w) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (i >= B * K) return;
  const int64_t b = i / K;
  const int k = static_cast<int>(i % K);
  const double N = warp_ordered_sum(Npart + b * col_chunks, col_chunks, 1);
  if ((threadIdx.x & 31) == 0) {
    const double A = alpha_total(Apart, k, nblk_alpha);
    w[i] = static_cast<double>(grad[i]) * dpoch<double>(A, N) + (N == N ? 0.0 : NAN);
  }
}

constexpr int kFinishThreads = 256;

// S[k] = sum_b w[b, k], in a fixed order; grid (K), a block each. A
// non-finite concentration anywhere in the component poisons S[k].
__global__ void __launch_bounds__(kFinishThreads)
    sum_weights_kernel(const double* __restrict__ w, const double* __restrict__ Apart,
                       int nblk_alpha, int64_t B, int K, double* __restrict__ S) {
  const int k = blockIdx.x;
  __shared__ double warp_sums[kFinishThreads / 32];
  double s = 0.0;
#pragma unroll 8
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) s += w[b * K + k];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < kFinishThreads / 32; ++i) total += warp_sums[i];
    const double A = alpha_total(Apart, k, nblk_alpha);
    S[k] = A == A ? total : NAN;
  }
}

// grid (ceil(V / 32), K), 8 warps: grad[k, v] = sum_tiles Cpart[tile, k, v]
// - a_kv S[k]. Lane l owns column v = 32 blockIdx.x + l; warp w sums tiles
// w, w + 8, ...; the 8 warp sums are added in order.
template <typename scalar_t>
__global__ void __launch_bounds__(kFinishThreads)
    column_finish_kernel(const double* __restrict__ Cpart, const double* __restrict__ S,
                         const ColumnAlpha<scalar_t>* __restrict__ cols, int64_t V, int K,
                         int64_t row_tiles, scalar_t* __restrict__ grad_la) {
  const int k = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  __shared__ double sums[kFinishThreads / 32][32];
  double c = 0.0;
  if (v < V) {
#pragma unroll 4
    for (int64_t tile = warp; tile < row_tiles; tile += kFinishThreads / 32) {
      c += Cpart[(tile * K + k) * V + v];
    }
  }
  sums[warp][lane] = c;
  __syncthreads();
  if (warp == 0 && v < V) {
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < kFinishThreads / 32; ++i) total += sums[i][lane];
    grad_la[k * V + v] = static_cast<scalar_t>(total - static_cast<double>(cols[k * V + v].a) * S[k]);
  }
}

// Row quantities for the elementwise gradients:
//   d   = dpoch(A_b, N_b)                                   (per-sample grad_la)
//   psi = -digamma(N_b + A_b) [+ digamma(N_b + 1)]          (grad_counts)
struct RowTotals {
  double d, psi;
};

// One warp per row. shared_A >= 0 (from Apart) for shared alpha; per-sample
// alpha sums A_b from log_alpha (B, V).
template <typename scalar_t, typename count_t>
__global__ void __launch_bounds__(256)
    row_totals_kernel(const count_t* __restrict__ counts, const scalar_t* __restrict__ log_alpha,
                      const double* __restrict__ Apart, int nblk_alpha, bool per_sample,
                      int64_t B, int64_t V, bool normalize, RowTotals* __restrict__ totals) {
  const int lane = threadIdx.x & 31;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (b >= B) return;
  double N = 0.0, A = 0.0;
  bool ok = true;
  for (int64_t v = lane; v < V; v += 32) {
    const scalar_t n = static_cast<scalar_t>(counts[b * V + v]);
    ok = ok && (n == scalar_t(0) || is_valid_count(n));
    N += static_cast<double>(counts[b * V + v]);
    if (per_sample) {
      const scalar_t la = log_alpha[b * V + v];
      ok = ok && is_finite(la);
      A += static_cast<double>(dm_exp(la));
    }
  }
  N = warp_sum(N);
  A = warp_sum(A);
  const bool row_ok = __all_sync(0xffffffffu, ok);
  if (lane == 0) {
    if (!per_sample) A = alpha_total(Apart, 0, nblk_alpha);
    if (!row_ok) N = NAN;
    double psi = -digamma<double>(N + A);
    if (normalize) psi += digamma<double>(N + 1.0);
    totals[b] = {dpoch<double>(A, N) + (N == N ? 0.0 : NAN), psi};
  }
}

// grad_la (per-sample, may be null) and grad_counts (may be null), (B, V).
template <typename scalar_t, typename count_t>
__global__ void elementwise_backward_kernel(const scalar_t* __restrict__ grad,
                                            const count_t* __restrict__ counts,
                                            const scalar_t* __restrict__ log_alpha,
                                            bool per_sample, const RowTotals* __restrict__ totals,
                                            int64_t B, int64_t V, bool normalize,
                                            scalar_t* __restrict__ grad_la,
                                            scalar_t* __restrict__ grad_counts) {
  const int64_t total = B * V;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / V, v = i % V;
    const scalar_t la = per_sample ? log_alpha[i] : log_alpha[v];
    const scalar_t a = dm_exp(la);
    const scalar_t n = static_cast<scalar_t>(counts[i]);
    const double g = static_cast<double>(grad[b]);
    const RowTotals r = totals[b];
    if (grad_la != nullptr) {
      grad_la[i] = static_cast<scalar_t>(
          g * (static_cast<double>(adpoch(a, n)) - static_cast<double>(a) * r.d));
    }
    if (grad_counts != nullptr) {
      double e = static_cast<double>(digamma<scalar_t>(n + a));
      if (normalize) e -= static_cast<double>(digamma<scalar_t>(n + scalar_t(1)));
      grad_counts[i] = static_cast<scalar_t>(g * (e + r.psi));
    }
  }
}


}  // namespace cuda
}  // namespace dirmult
