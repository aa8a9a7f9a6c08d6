// The CSR backward (See Note [CSR gradient]): the row weights' sums S_k in
// fixed blocks summed in order, then a warp per column over the
// column-sorted copy, each column's rows in increasing order: no atomics,
// the same bits every run.
#pragma once

#include "csr_alpha.cuh"

namespace dirmult {
namespace cuda {

constexpr int kCsrBackwardWarps = 8;
// Consecutive rows summed by one warp: few, so that the warps are many and
// each row's walk overlaps other warps' (a warp walks its rows one by one).
constexpr int kCsrRowsPerWarp = 8;
constexpr int kCsrSumThreads = 256;
// Nonzeros a lane loads before it uses any (the loads' latencies overlap).
constexpr int kCsrBackwardLoads = 4;

// Warp w (of ceil(B / kCsrRowsPerWarp)) takes rows [R w, R w + R) in order:
// part[w * K + k] = sum over its rows with g[b, k] != 0 of g[b, k]
// dpoch(A_k, N_b) (NaN for a bad row), summed in row order. Lane r holds
// row r's N (warp_sum's value, as the forward's) and, for K < 32, computes
// its row's terms, the sum taking them in order; for K >= 32 lane l takes
// components l, l + 32, ... over the rows in order. The same sums either
// way.
template <typename T, typename value_t, typename index_t>
__global__ void __launch_bounds__(kCsrBackwardWarps * 32)
    csr_row_weights_kernel(const T* __restrict__ grad, const index_t* __restrict__ crow,
                           const value_t* __restrict__ val, int64_t B, int64_t nnz, int K,
                           const double* __restrict__ log_A, int64_t warps,
                           double* __restrict__ part) {
  static_assert(kCsrRowsPerWarp <= 32, "a lane per row");
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kCsrBackwardWarps + (threadIdx.x >> 5);
  if (w >= warps) return;  // (warp-uniform)
  const int64_t b0 = w * kCsrRowsPerWarp;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kCsrRowsPerWarp), B - b0));
  double mine_N = 0.0;  // lane r < rows: row b0 + r's N, NaN for a bad row
  for (int r = 0; r < rows; ++r) {
    int64_t j0, j1;
    const bool range_ok = csr_row_range(crow, b0 + r, nnz, j0, j1);
    double lane_N = 0.0;
    bool lane_ok = true;
    for (int64_t jb = j0 + lane; jb < j1; jb += 32 * kCsrBackwardLoads) {
      value_t x[kCsrBackwardLoads];
#pragma unroll
      for (int u = 0; u < kCsrBackwardLoads; ++u) {
        const int64_t j = jb + 32 * u;
        x[u] = j < j1 ? __ldg(val + j) : value_t(0);
      }
#pragma unroll
      for (int u = 0; u < kCsrBackwardLoads; ++u) {
        if (jb + 32 * u < j1) {
          lane_ok = lane_ok && is_valid_count(static_cast<T>(x[u]));
          lane_N += static_cast<double>(x[u]);
        }
      }
    }
    double N = __shfl_sync(0xffffffffu, warp_sum(lane_N), 0);
    if (!(__all_sync(0xffffffffu, lane_ok) && range_ok)) N = static_cast<double>(NAN);
    if (lane == r) mine_N = N;
  }
  if (K < 32) {
    for (int k = 0; k < K; ++k) {
      double t = 0.0;
      bool use = false;
      if (lane < rows) {
        const double g = static_cast<double>(grad[(b0 + lane) * K + k]);
        use = g != 0.0;
        if (use) {
          t = mine_N == mine_N ? g * log_total<T>(log_A[k]).row_weight(mine_N)
                               : static_cast<double>(NAN);
        }
      }
      const unsigned used = __ballot_sync(0xffffffffu, use);
      double p = 0.0;
      for (int r = 0; r < rows; ++r) {
        const double tr = __shfl_sync(0xffffffffu, t, r);
        if ((used >> r) & 1u) p += tr;
      }
      if (lane == 0) part[w * K + k] = p;
    }
    return;
  }
  for (int k0 = 0; k0 < K; k0 += 32) {  // (warp-uniform: the shuffles take every lane)
    const int k = k0 + lane;
    double p = 0.0;
    for (int r = 0; r < rows; ++r) {
      const double N = __shfl_sync(0xffffffffu, mine_N, r);
      const double g = k < K ? static_cast<double>(grad[(b0 + r) * K + k]) : 0.0;
      if (g != 0.0) {
        p += N == N ? g * log_total<T>(log_A[k]).row_weight(N) : static_cast<double>(NAN);
      }
    }
    if (k < K) part[w * K + k] = p;
  }
}

// S[k] = sum of part[w * K + k] over w in order of a fixed tree: block k,
// thread t sums w = t, t + 256, ...; then the 256 partial sums in order.
// NaN where log A_k is (a non-finite log_alpha of k makes its gradient NaN).
// S[K + k] = log A_k where A_k is out of range (the columns' factor is then
// a / A_k: LogTotal::column_factor), else NaN.
template <typename T>
__global__ void __launch_bounds__(kCsrSumThreads)
    csr_sum_weights_kernel(const double* __restrict__ part, int64_t warps, int K,
                           const double* __restrict__ log_A, double* __restrict__ S) {
  const int k = blockIdx.x;
  double s = 0.0;
  for (int64_t w = threadIdx.x; w < warps; w += kCsrSumThreads) s += part[w * K + k];
  __shared__ double t[kCsrSumThreads];
  t[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < kCsrSumThreads; ++i) total += t[i];
    const LogTotal A = log_total<T>(log_A[k]);
    S[k] = A.log_A == A.log_A ? total : static_cast<double>(NAN);
    S[K + k] = A.scaled ? A.log_A : static_cast<double>(NAN);
  }
}

// grad_la[k * V + v] = sum over column v's nonzeros j (row r, in
// increasing r) of g[r, k] adpoch(a_kv, n_j) - a_kv S_k: a warp per column,
// lanes striding over its nonzeros, a fixed tree across the lanes. Lane l
// holds adpoch(a_kv, l + 1) for l < kMaxExactCount (adpoch_exact's value,
// the same products), which a nonzero of such a count takes by a shuffle.
template <typename T, typename value_t, typename index_t>
__global__ void __launch_bounds__(kCsrBackwardWarps * 32)
    csr_column_grad_kernel(const T* __restrict__ grad, const index_t* __restrict__ csc_ptr,
                           const index_t* __restrict__ csc_row, const value_t* __restrict__ csc_val,
                           int64_t B, int64_t nnz, int64_t V, int K,
                           const CsrColumn<T>* __restrict__ cols, const double* __restrict__ S,
                           T* __restrict__ grad_la) {
  constexpr int U = kCsrBackwardLoads;
  const int lane = threadIdx.x & 31;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kCsrBackwardWarps + (threadIdx.x >> 5);
  if (v >= V) return;  // (warp-uniform)
  int64_t j0 = static_cast<int64_t>(__ldg(csc_ptr + v));
  int64_t j1 = static_cast<int64_t>(__ldg(csc_ptr + v + 1));
  const bool range_ok = 0 <= j0 && j0 <= j1 && j1 <= nnz;
  if (!range_ok) j0 = j1 = 0;
  for (int k = 0; k < K; ++k) {
    const CsrColumn<T> cs = load_csr_column(cols + v * K + k);
    const ExactFactors<T> f = cs.factors();
    T held = T(0);  // adpoch(a, lane + 1)
    {
      ExactRun<T> run;
      const int n_held = min(lane + 1, kMaxExactCount);
      for (int m = 1; m < n_held; ++m) exact_run_step(f, m, run);
      held = exact_run_value(run, f, cs.a, cs.log_a, n_held, false, false);
    }
    double c = 0.0;
    bool lane_ok = true;
    for (int64_t jb = j0; jb < j1; jb += 32 * U) {  // (warp-uniform)
      int64_t r[U];
      T n[U];
      double g[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = jb + lane + 32 * u;
        const bool present = j < j1;
        r[u] = present ? static_cast<int64_t>(__ldg(csc_row + j)) : 0;
        n[u] = present ? static_cast<T>(__ldg(csc_val + j)) : T(0);
        if (present && (r[u] < 0 || r[u] >= B)) lane_ok = false, n[u] = T(0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // (A bad count's row has N NaN: S_k and so the gradient are NaN.)
        const bool term = n[u] != T(0) && is_valid_count(n[u]);
        g[u] = term ? static_cast<double>(grad[r[u] * K + k]) : 0.0;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool exact = is_exact_count(n[u]) && n[u] != T(0);
        const T e = __shfl_sync(0xffffffffu, held, exact ? static_cast<int>(n[u]) - 1 : 0);
        if (g[u] != 0.0) {
          c += g[u] * static_cast<double>(exact ? e : adpoch_off_exact(f, cs.a, n[u]));
        }
      }
    }
    c = warp_sum(c);
    const bool ok = __all_sync(0xffffffffu, lane_ok) && range_ok;
    if (lane == 0) {
      const double log_A = S[K + k];
      const double f = log_A == log_A ? scaled_column_factor(cs.log_a, log_A)
                                      : static_cast<double>(cs.a);
      grad_la[static_cast<int64_t>(k) * V + v] =
          static_cast<T>(ok ? c - f * S[k] : static_cast<double>(NAN));
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
