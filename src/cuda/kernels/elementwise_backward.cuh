// The elementwise gradients (per-sample alpha, the counts gradient) once
// the row totals are known: row_totals_kernel, then
// elementwise_backward_kernel.
#pragma once

#include "alpha_prep.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// Row quantities for the elementwise gradients:
//   d     = dpoch(A_b, N_b), or adpoch(A_b, N_b) where A_b is out of range
//           (LogTotal::row_weight)                      (per-sample grad_la)
//   psi   = -digamma(N_b + A_b) [+ digamma(N_b + 1)]    (grad_counts)
//   log_A = log A_b where A_b is out of range (a column's factor is then
//           a_v / A_b), else NaN (the factor is a_v)
struct RowTotals {
  double d, psi, log_A;

  template <typename scalar_t>
  __device__ __forceinline__ double column_factor(scalar_t a, scalar_t la) const {
    return log_A == log_A ? exp(static_cast<double>(la) - log_A) : static_cast<double>(a);
  }
};

// A row's RowTotals from its N and log A (See Note [Log-space totals]); a
// bad count (row_ok false) makes them NaN.
template <typename scalar_t>
__device__ __forceinline__ RowTotals row_totals(double N, double log_A, bool row_ok,
                                                bool normalize) {
  if (!row_ok) N = NAN;
  const LogTotal A = log_total<scalar_t>(log_A);
  double psi = -digamma<double>(N + A.A);
  if (normalize) psi += digamma<double>(N + 1.0);
  return {A.row_weight(N) + (N == N ? 0.0 : NAN), psi, A.scaled ? A.log_A : NAN};
}

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
    const double log_A = per_sample ? row_log_total(A, log_alpha + b * V, V)
                                    : alpha_log_total<scalar_t>(Apart, 0, nblk_alpha);
    totals[b] = row_totals<scalar_t>(N, log_A, row_ok, normalize);
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
      grad_la[i] = g == 0.0 ? scalar_t(0)  // See Note [Zero-weight rows]
                            : static_cast<scalar_t>(g * (static_cast<double>(adpoch(a, n)) -
                                                         r.column_factor(a, la) * r.d));
    }
    if (grad_counts != nullptr) {
      double e = static_cast<double>(digamma<scalar_t>(n + a));
      if (normalize) e -= static_cast<double>(digamma<scalar_t>(n + scalar_t(1)));
      grad_counts[i] = g == 0.0 ? scalar_t(0) : static_cast<scalar_t>(g * (e + r.psi));
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
