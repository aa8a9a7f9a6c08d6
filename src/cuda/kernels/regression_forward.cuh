// The fused regression forward (See Note [Regression fusion]): per row b,
// sum_v lnpoch(alpha_bv, n_bv) - lnpoch(A_b, N_b) with log alpha_b = X[b] W
// + bias computed in registers. Grid (row groups, column tiles); a block
// stages its tile of W once, then takes its group's rows kRows at a time.
// Also the backward's row totals where rows span several tiles.
#pragma once

#include "dirmult/math.h"
#include "per_sample_forward.cuh"
#include "regression_tile.cuh"
#include "row_chunks.cuh"
#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// out[b] (one tile), else partial[b * tiles + tile] = {s, N, norm, A} for
// finish_rows_kernel (s NaN for a bad row). totals_only: N and A alone
// (s 0 or NaN), the backward's first pass. Dynamic shared memory: the W
// tile, kMaxP x blockDim.x x kCols values.
template <typename scalar_t, typename count_t, int kCols, int kMaxP, int kRows, int kThreads>
__global__ void __launch_bounds__(kThreads)
    regression_forward_kernel(const count_t* __restrict__ counts, const scalar_t* __restrict__ X,
                              const scalar_t* __restrict__ W, const scalar_t* __restrict__ bias,
                              int64_t B, int64_t V, int P, int64_t rows_per_group, bool aligned,
                              bool normalize, bool totals_only, scalar_t* __restrict__ out,
                              RowPartial* __restrict__ partial) {
  constexpr int kWarps = kThreads / 32;
  extern __shared__ __align__(16) unsigned char regression_smem[];
  auto* W_s = reinterpret_cast<scalar_t*>(regression_smem);
  __shared__ scalar_t X_s[kMaxP * kRows];
  __shared__ double sums[kRows][kWarps][4];  // a warp's (s, N, norm, A) per row
  __shared__ bool sums_ok[kRows][kWarps];
  __shared__ scalar_t log_fact[kTableWidth];  // log n!, n = 0 .. kMaxExactCount
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tiles = gridDim.y;

  stage_w_tile<scalar_t, kCols, kMaxP>(W, P, V, W_s);
  if (threadIdx.x < kTableWidth) {
    log_fact[threadIdx.x] = log_factorial(static_cast<scalar_t>(threadIdx.x));
  }
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_group;
  const int64_t row_end = min(B, row_begin + rows_per_group);
  for (int64_t b0 = row_begin; b0 < row_end; b0 += kRows) {
    // (The thread's columns and bias are reloaded per batch rather than held
    // through the loop: fewer values live across the rare terms' calls.
    // The counts' loads are issued before the barrier, to be in flight
    // through it.)
    const ThreadCols<kCols> cols = thread_cols<kCols>(V);
    scalar_t bias_c[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      bias_c[j] = bias != nullptr && cols.in[j] ? bias[cols.first + j] : scalar_t(0);
    }
    count_t c[kRows][kCols];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      load_thread_counts<count_t, kCols>(b0 + r < row_end ? counts + (b0 + r) * V : nullptr, cols,
                                         aligned, c[r]);
    }
    __syncthreads();  // the W tile staged; the last batch's X_s and sums read
    stage_x_batch<scalar_t, kMaxP, kRows>(X, P, b0, row_end, X_s);
    __syncthreads();
    scalar_t la[kRows][kCols];
    batch_log_alpha<scalar_t, kCols, kMaxP, kRows>(W_s, X_s, P, bias_c, la);
    // Counts off the exact path, and exact ones whose float32 value cancels,
    // are marked (bit r kCols + j) and taken after the batch's rows, when
    // no register array is live across the out-of-line math calls.
    unsigned later = 0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      double s = 0.0, N = 0.0, norm = 0.0;
      scalar_t asum = scalar_t(0);
      bool ok = true;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        if (!cols.in[j]) continue;
        const scalar_t a = dm_exp(la[r][j]);
        ok = ok && is_finite(la[r][j]);
        asum += a;
        const scalar_t n = static_cast<scalar_t>(c[r][j]);
        if (n == scalar_t(0)) continue;
        if (!is_valid_count(n)) {  // the row is NaN; no term for it
          ok = false;
          continue;
        }
        N += static_cast<double>(c[r][j]);
        if (totals_only) continue;
        if (is_exact_count(n)) {
          const int m = static_cast<int>(n);
          const scalar_t t = lnpoch_exact(exact_factors(a), la[r][j], m);
          if (!lnpoch_exact_cancels(la[r][j], m, t)) {
            s += static_cast<double>(t);
            if (normalize) norm -= static_cast<double>(log_fact[m]);
            continue;
          }
        }
        later |= 1u << (r * kCols + j);
      }
      const double v = warp_sum4_transposed(s, N, norm, static_cast<double>(asum));
      const bool row_ok = __all_sync(0xffffffffu, ok);
      if ((lane & 7) == 0) sums[r][warp][lane >> 3] = v;
      if (lane == 0) sums_ok[r][warp] = row_ok;
    }
    if (__any_sync(0xffffffffu, later != 0)) {
      __syncwarp();  // the warp's sums written
#pragma unroll 1
      for (int r = 0; r < kRows; ++r) {
        unsigned mine = (later >> (r * kCols)) & ((1u << kCols) - 1u);
        if (!__any_sync(0xffffffffu, mine != 0)) continue;
        double s = 0.0, norm = 0.0;
        for (; mine != 0; mine &= mine - 1) {
          const int j = __ffs(static_cast<int>(mine)) - 1;
          const int64_t v = cols.first + j;
          const scalar_t l = log_alpha_at<scalar_t, kCols, kRows>(
              W_s, X_s, P, bias != nullptr ? bias[v] : scalar_t(0), r,
              static_cast<int>(threadIdx.x) * kCols + j);
          const scalar_t n = static_cast<scalar_t>(counts[(b0 + r) * V + v]);
          s += static_cast<double>(lnpoch(dm_exp(l), l, n));
          if (normalize) norm -= static_cast<double>(log_factorial(n));
        }
        s = warp_sum(s);
        norm = warp_sum(norm);
        if (lane == 0) sums[r][warp][0] += s, sums[r][warp][2] += norm;
      }
    }
    __syncthreads();
    if (threadIdx.x < kRows && b0 + threadIdx.x < row_end) {
      const int r = threadIdx.x;
      const int64_t b = b0 + r;
      double s = 0.0, N = 0.0, norm = 0.0, A = 0.0;
      bool ok = true;
      for (int w = 0; w < kWarps; ++w) {  // the warps in order
        s += sums[r][w][0], N += sums[r][w][1], norm += sums[r][w][2], A += sums[r][w][3];
        ok = ok && sums_ok[r][w];
      }
      if (!ok) s = NAN;
      if (tiles == 1 && !totals_only) {
        out[b] = static_cast<scalar_t>(finish_row(s, N, norm, A, normalize));
      } else {
        partial[b * tiles + blockIdx.y] = {s, N, norm, A};
      }
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
