// The fused regression backward (See Note [Regression fusion]): with
// G[b, v] = g_b (adpoch(alpha_bv, n_bv) - alpha_bv dpoch(A_b, N_b)), the
// gradients dX = G W^T, dW = X^T G and dbias = sum_b G, G recomputed in
// registers and never stored. Grid (row groups, column tiles) as the
// forward's; a block's dW partials stay in shared memory (each thread's own
// slots of its columns) and its dbias partials in registers until its last
// row, then go to the per-group scratch that regression_sum_partials_kernel
// sums in group order (See Note [Determinism]).
#pragma once

#include "dirmult/math.h"
#include "regression_tile.cuh"
#include "row_chunks.cuh"
#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// The dynamic shared memory of regression_backward_kernel, in values.
template <int kCols, int kMaxP, int kRows, int kThreads>
constexpr int regression_backward_smem_values() {
  return (2 * kMaxP + kRows) * kThreads * kCols + (kThreads / 32) * kMaxP * kRows;
}

// totals: (B, tiles) row partials from regression_forward_kernel in
// totals_only mode, or nullptr where the row is one tile (the block then
// sums its rows' N and A itself, from the same loads). dX: (B, P) for one
// tile, else dX_part (tiles, B, P). dW_part (groups, P, V), dbias_part
// (groups, V) or nullptr (no bias). Dynamic shared memory
// (regression_backward_smem_values): the W tile and the dW partials (kMaxP
// x tile values each), the batch's G (kRows x tile), dX's warp sums (kWarps
// x kMaxP x kRows).
template <typename scalar_t, typename count_t, int kCols, int kMaxP, int kRows, int kThreads>
__global__ void __launch_bounds__(kThreads)
    regression_backward_kernel(const scalar_t* __restrict__ grad,
                               const count_t* __restrict__ counts, const scalar_t* __restrict__ X,
                               const scalar_t* __restrict__ W, const scalar_t* __restrict__ bias,
                               const RowPartial* __restrict__ totals, int64_t B, int64_t V, int P,
                               int64_t rows_per_group, bool aligned, scalar_t* __restrict__ dX,
                               scalar_t* __restrict__ dX_part, scalar_t* __restrict__ dW_part,
                               scalar_t* __restrict__ dbias_part) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kRows >= 1 && kRows <= 32 && (kRows & (kRows - 1)) == 0,
                "rows per batch: a power of two for warp_reduce_scatter");
  extern __shared__ __align__(16) unsigned char regression_smem[];
  const int tile = kThreads * kCols;
  auto* W_s = reinterpret_cast<scalar_t*>(regression_smem);
  scalar_t* dW_s = W_s + kMaxP * tile;  // [p][column of the tile]
  scalar_t* G_s = dW_s + kMaxP * tile;  // [r][column of the tile]
  scalar_t* dx_s = G_s + kRows * tile;  // [warp][p][r]
  __shared__ scalar_t X_s[kMaxP * kRows];
  __shared__ double g_s[kRows], d_s[kRows];
  __shared__ double row_sums[kRows][kWarps][2];  // a warp's (N, A) per row
  __shared__ bool row_ok[kRows][kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tiles = gridDim.y;

  stage_w_tile<scalar_t, kCols, kMaxP>(W, P, V, W_s);
  // (Shared memory rather than registers: the out-of-line math calls of the
  // rare counts would save 64 live accumulators around them.)
  const int own = static_cast<int>(threadIdx.x) * kCols;  // the thread's slots
  scalar_t dbias_acc[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    dbias_acc[j] = scalar_t(0);
#pragma unroll
    for (int p = 0; p < kMaxP; ++p) dW_s[p * tile + own + j] = scalar_t(0);
  }
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_group;
  const int64_t row_end = min(B, row_begin + rows_per_group);
  for (int64_t b0 = row_begin; b0 < row_end; b0 += kRows) {
    // (Columns and bias reloaded per batch, as in the forward.)
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
    __syncthreads();  // the W tile staged; the last batch's shared values read
    stage_x_batch<scalar_t, kMaxP, kRows>(X, P, b0, row_end, X_s);
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x;
      const int64_t b = b0 + r;
      g_s[r] = b < row_end ? static_cast<double>(grad[b]) : 0.0;
      if (totals != nullptr && b < row_end) {
        double N = 0.0, A = 0.0;
        bool ok = true;
        for (int64_t t = 0; t < tiles; ++t) {  // the tiles in order
          const RowPartial q = totals[b * tiles + t];
          N += q.n, A += q.a, ok = ok && q.s == q.s;
        }
        d_s[r] = ok ? dpoch<double>(A, N) : NAN;
      }
    }
    __syncthreads();
    scalar_t a[kRows][kCols];
    batch_log_alpha<scalar_t, kCols, kMaxP, kRows>(W_s, X_s, P, bias_c, a);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      double N = 0.0;
      scalar_t asum = scalar_t(0);
      bool ok = true;
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const scalar_t la = a[r][j];
        a[r][j] = cols.in[j] ? dm_exp(la) : scalar_t(0);
        ok = ok && (!cols.in[j] || is_finite(la));
        asum += a[r][j];
        const scalar_t n = static_cast<scalar_t>(c[r][j]);
        ok = ok && (n == scalar_t(0) || is_valid_count(n));
        N += static_cast<double>(c[r][j]);
        // alpha to the thread's G_s slots: the row totals' dpoch calls below
        // then find no register array live around them.
        G_s[r * tile + own + j] = a[r][j];
      }
      if (totals == nullptr) {  // (uniform over the grid)
        const double Nw = warp_sum(N), Aw = warp_sum(static_cast<double>(asum));
        const bool okw = __all_sync(0xffffffffu, ok);
        if (lane == 0) {
          row_sums[r][warp][0] = Nw, row_sums[r][warp][1] = Aw;
          row_ok[r][warp] = okw;
        }
      }
    }
    if (totals == nullptr) {
      __syncthreads();
      if (threadIdx.x < kRows && b0 + threadIdx.x < row_end) {
        const int r = threadIdx.x;
        double N = 0.0, A = 0.0;
        bool ok = true;
        for (int w = 0; w < kWarps; ++w) {  // the warps in order
          N += row_sums[r][w][0], A += row_sums[r][w][1], ok = ok && row_ok[r][w];
        }
        d_s[r] = ok ? dpoch<double>(A, N) : NAN;
      }
      __syncthreads();
    }
    // G to the thread's slots of G_s. A row of incoming gradient 0
    // contributes 0, whatever its counts (See Note [Zero-weight rows]).
    // Counts off the exact path are marked (bit r kCols + j) and taken
    // after the others, with no register array live across their calls.
    unsigned later = 0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const double g = g_s[r], d = d_s[r];
      // (The counts again, from the caches: see G_s above.)
      count_t cr[kCols];
      load_thread_counts<count_t, kCols>(b0 + r < row_end ? counts + (b0 + r) * V : nullptr, cols,
                                         aligned, cr);
      const ColVec<scalar_t, kCols> ar =
          *reinterpret_cast<const ColVec<scalar_t, kCols>*>(G_s + r * tile + own);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const scalar_t a_j = ar.v[j];
        scalar_t G = scalar_t(0);
        if (g != 0.0 && cols.in[j]) {
          const scalar_t n = static_cast<scalar_t>(cr[j]);
          if (d != d) {
            G = static_cast<scalar_t>(NAN);
          } else if (n == scalar_t(0) || is_exact_count(n)) {
            const double adp =
                n == scalar_t(0)
                    ? 0.0
                    : static_cast<double>(adpoch_exact(exact_factors(a_j), a_j,
                                                       static_cast<int>(n)));
            G = static_cast<scalar_t>(g * (adp - static_cast<double>(a_j) * d));
          } else {
            later |= 1u << (r * kCols + j);
          }
        }
        G_s[r * tile + own + j] = G;
      }
    }
#pragma unroll 1
    for (; later != 0; later &= later - 1) {
      const int e = __ffs(static_cast<int>(later)) - 1;
      const int r = e / kCols, j = e - r * kCols;
      const int64_t v = cols.first + j;
      const scalar_t l = log_alpha_at<scalar_t, kCols, kRows>(
          W_s, X_s, P, bias != nullptr ? bias[v] : scalar_t(0), r, own + j);
      const scalar_t a_v = dm_exp(l);
      const scalar_t n = static_cast<scalar_t>(counts[(b0 + r) * V + v]);
      const double adp = static_cast<double>(adpoch(a_v, n));
      G_s[r * tile + own + j] =
          static_cast<scalar_t>(g_s[r] * (adp - static_cast<double>(a_v) * d_s[r]));
    }
    scalar_t G[kRows][kCols];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const ColVec<scalar_t, kCols> x =
          *reinterpret_cast<const ColVec<scalar_t, kCols>*>(G_s + r * tile + own);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        G[r][j] = x.v[j];
        dbias_acc[j] += G[r][j];
      }
    }
    // dW += X^T G and the rows' dX pieces G W^T, p by p: one load of the
    // thread's W values and of its dW slots, and one broadcast read of X_s
    // per row, serve both.
    scalar_t* dx_w = dx_s + warp * kMaxP * kRows;
#pragma unroll
    for (int p = 0; p < kMaxP; ++p) {
      if (p >= P) break;
      const ColVec<scalar_t, kCols> w =
          *reinterpret_cast<const ColVec<scalar_t, kCols>*>(W_s + p * tile + own);
      auto* acc_at = reinterpret_cast<ColVec<scalar_t, kCols>*>(dW_s + p * tile + own);
      ColVec<scalar_t, kCols> acc = *acc_at;
      scalar_t dx[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const scalar_t x = X_s[p * kRows + r];
        scalar_t t = scalar_t(0);
#pragma unroll
        for (int j = 0; j < kCols; ++j) {
          acc.v[j] = fma(x, G[r][j], acc.v[j]);
          t = fma(G[r][j], w.v[j], t);
        }
        dx[r] = t;
      }
      *acc_at = acc;
      // Lane l: the warp's sum for row l % kRows (a fixed order).
      const scalar_t sum = warp_reduce_scatter<kRows, scalar_t>(dx, lane);
      if (lane < kRows) dx_w[p * kRows + lane] = sum;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * P; i += kThreads) {
      const int r = i / P, p = i - r * P;
      const int64_t b = b0 + r;
      if (b >= row_end) continue;
      double s = 0.0;
      for (int w = 0; w < kWarps; ++w) s += static_cast<double>(dx_s[(w * kMaxP + p) * kRows + r]);
      if (tiles == 1) {
        dX[b * P + p] = static_cast<scalar_t>(s);
      } else {
        dX_part[(blockIdx.y * B + b) * P + p] = static_cast<scalar_t>(s);
      }
    }
  }
  // The group's partials of its tile's columns.
  const ThreadCols<kCols> cols = thread_cols<kCols>(V);
  const int64_t group = blockIdx.x;
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    if (!cols.in[j]) continue;
    const int64_t v = cols.first + j;
#pragma unroll
    for (int p = 0; p < kMaxP; ++p) {
      if (p < P) dW_part[(group * P + p) * V + v] = dW_s[p * tile + own + j];
    }
    if (dbias_part != nullptr) dbias_part[group * V + v] = dbias_acc[j];
  }
}

// out[i] = sum_k part[k * n + i], k = 0 .. parts - 1 in order, in float64:
// the groups' dW and dbias partials, and the tiles' dX pieces.
template <typename scalar_t>
__global__ void __launch_bounds__(256)
    regression_sum_partials_kernel(const scalar_t* __restrict__ part, int64_t parts, int64_t n,
                                   scalar_t* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double s = 0.0;
    for (int64_t k = 0; k < parts; ++k) s += static_cast<double>(part[k * n + i]);
    out[i] = static_cast<scalar_t>(s);
  }
}

}  // namespace cuda
}  // namespace dirmult
