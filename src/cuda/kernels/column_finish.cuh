// The backward's finish of shared or component alpha: the row weights
// (row_weights_kernel), then grad_la from the column partials
// (column_finish_kernel), in fixed orders (See Note [Determinism]).
#pragma once

#include "alpha_prep.cuh"
#include "ceil_div.cuh"
#include "row_chunks.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// Wpart[k, blk] = sum over the block's rows b of w[b, k] = G[b, k] dpoch(A_k,
// N_b), N_b the sum of Npart[b, 0 .. parts) in a fixed order; grid
// (row_weights_blocks, K). A row's parts are summed by a thread (few parts),
// a warp or the whole block (many), rows_per_weight_block rows per block;
// the row's first thread finishes it. The block's rows are summed in a fixed
// order, and column_finish_kernel sums the block partials in order: S_k =
// sum_b w[b, k] without a launch of its own, bitwise reproducible.
constexpr int kWeightThreads = 256;
constexpr int64_t kMaxPartsPerThread = 32;
constexpr int64_t kMaxPartsPerWarp = 32 * 32;

__host__ __device__ inline int64_t rows_per_weight_block(int64_t parts) {
  return parts <= kMaxPartsPerThread ? kWeightThreads
         : parts <= kMaxPartsPerWarp ? kWeightThreads / 32
                                     : 1;
}

inline int64_t row_weights_blocks(int64_t B, int64_t parts) {
  return ceil_div(B, rows_per_weight_block(parts));
}

// The sum of x over the block's threads, in a fixed order; valid in thread 0.
__device__ __forceinline__ double block_sum(double x, double* __restrict__ warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // warp_sums may still be read from a previous call
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total += warp_sums[i];
  }
  return total;
}

// grad null: unit weights (G = 1, the gradient of the rows' sum). Lpart
// non-null (K == 1, log_lik_with_grad): the rows' lnpoch partials, laid out
// as Npart, summed the same way; out[b] = the row's log-likelihood.
template <typename scalar_t>
__global__ void __launch_bounds__(kWeightThreads)
    row_weights_kernel(const scalar_t* __restrict__ grad, const double* __restrict__ Npart,
                       int64_t parts, const double* __restrict__ Apart, int nblk_alpha,
                       int64_t B, int K, double* __restrict__ Wpart,
                       const double* __restrict__ Lpart, bool normalize,
                       scalar_t* __restrict__ out) {
  __shared__ double warp_sums[kWeightThreads / 32];
  const int k = blockIdx.y;
  const int64_t rows = rows_per_weight_block(parts);
  const int lanes = static_cast<int>(kWeightThreads / rows);  // threads per row: 1, 32 or 256
  const int64_t b = static_cast<int64_t>(blockIdx.x) * rows + threadIdx.x / lanes;
  const int sub = static_cast<int>(threadIdx.x) % lanes;
  double N = 0.0, L = 0.0;
  if (b < B) {
    for (int64_t p = sub; p < parts; p += lanes) {
      N += Npart[b * parts + p];
      if (Lpart != nullptr) L += Lpart[b * parts + p];
    }
  }
  if (lanes == 32) {  // b is the same in the whole warp: every lane takes part
    N = warp_sum(N);
    if (Lpart != nullptr) L = warp_sum(L);
  } else if (lanes == kWeightThreads) {
    N = block_sum(N, warp_sums);
    if (Lpart != nullptr) L = block_sum(L, warp_sums);
  }
  const bool mine = b < B && sub == 0;
  double w = 0.0;
  if (mine) {
    const LogTotal A = log_total<scalar_t>(alpha_log_total<scalar_t>(Apart, k, nblk_alpha));
    const double g = grad != nullptr ? static_cast<double>(grad[b * K + k]) : 1.0;
    w = g == 0.0 ? 0.0 : g * A.row_weight(N) + (N == N ? 0.0 : NAN);  // zero_weight_rows
    if (Lpart != nullptr) out[b] = static_cast<scalar_t>(finish_row(L, N, 0.0, A.log_A, normalize));
  }
  w = block_sum(w, warp_sums);
  if (threadIdx.x == 0) Wpart[static_cast<int64_t>(k) * gridDim.x + blockIdx.x] = w;
}

// 256 threads: 512 or 1024 made ptxas spill (docs/PERFORMANCE_LEDGER.md).
constexpr int kFinishThreads = 256;
constexpr int kFinishWarps = kFinishThreads / 32;

// Columns per column_finish_kernel block: a thread per column when there are
// few row tiles, else 32 columns whose tiles the warps split.
__host__ __device__ inline int64_t finish_columns_per_block(int64_t row_tiles) {
  return row_tiles < 8 ? kFinishThreads : 32;
}

// grid (ceil(V / finish_columns_per_block), K): grad[k, v] = sum_tiles
// Cpart[tile, k, v] - a_kv S_k, S_k the ordered sum of Wpart[k, 0 ..
// wblocks) (NaN when a concentration of component k is not finite; a_kv / A_k
// where A_k is out of range, LogTotal::column_factor). With
// 32 columns per block, lane l owns column 32 blockIdx.x + l, warp w sums
// tiles w, w + kFinishWarps, ..., and the warp sums are added in order.
template <typename scalar_t>
__global__ void __launch_bounds__(kFinishThreads)
    column_finish_kernel(const double* __restrict__ Cpart, const double* __restrict__ Wpart,
                         int64_t wblocks, const double* __restrict__ Apart, int nblk_alpha,
                         const ColumnAlpha<scalar_t>* __restrict__ cols, int64_t V, int K,
                         int64_t row_tiles, scalar_t* __restrict__ grad_la) {
  const int k = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ double sums[kFinishWarps][32];
  __shared__ double S_k;
  __shared__ LogTotal A_k;
  if (warp == 0) {
    const double S = warp_ordered_sum(Wpart + static_cast<int64_t>(k) * wblocks, wblocks, 1);
    const double log_A = alpha_log_total<scalar_t>(Apart, k, nblk_alpha);
    if (lane == 0) S_k = log_A == log_A ? S : NAN, A_k = log_total<scalar_t>(log_A);
  }
  const int64_t per_block = finish_columns_per_block(row_tiles);
  if (per_block == kFinishThreads) {
    const int64_t v = static_cast<int64_t>(blockIdx.x) * kFinishThreads + threadIdx.x;
    double total = 0.0;
    if (v < V) {
      for (int64_t tile = 0; tile < row_tiles; ++tile) total += Cpart[(tile * K + k) * V + v];
    }
    __syncthreads();
    if (v < V) {
      const ColumnAlpha<scalar_t> col = cols[k * V + v];
      grad_la[k * V + v] = static_cast<scalar_t>(total - A_k.column_factor(col.a, col.log_a) * S_k);
    }
    return;
  }
  const int64_t v = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  double c = 0.0;
  if (v < V) {
#pragma unroll 4
    for (int64_t tile = warp; tile < row_tiles; tile += kFinishWarps) {
      c += Cpart[(tile * K + k) * V + v];
    }
  }
  sums[warp][lane] = c;
  __syncthreads();
  if (warp == 0 && v < V) {
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < kFinishWarps; ++i) total += sums[i][lane];
    const ColumnAlpha<scalar_t> col = cols[k * V + v];
    grad_la[k * V + v] = static_cast<scalar_t>(total - A_k.column_factor(col.a, col.log_a) * S_k);
  }
}

}  // namespace cuda
}  // namespace dirmult
