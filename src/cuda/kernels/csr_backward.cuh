// The CSR backward (See Note [CSR gradient]): the row weights' sums S_k in
// fixed blocks summed in order, then a warp per column over the
// column-sorted copy, each column's rows in increasing order: no atomics,
// the same bits every run.
#pragma once

#include "csr_alpha.cuh"

namespace dirmult {
namespace cuda {

constexpr int kCsrBackwardWarps = 8;
constexpr int kCsrRowsPerWarp = 32;  // consecutive rows summed by one warp
constexpr int kCsrSumThreads = 256;

// Warp w (of ceil(B / 32)) takes rows [32 w, 32 w + 32) in order; lane l
// holds components k = l, l + 32, ...: part[w * K + k] = sum over its rows
// with g[b, k] != 0 of g[b, k] dpoch(A_k, N_b) (NaN for a bad row).
template <typename T, typename value_t, typename index_t>
__global__ void __launch_bounds__(kCsrBackwardWarps * 32)
    csr_row_weights_kernel(const T* __restrict__ grad, const index_t* __restrict__ crow,
                           const value_t* __restrict__ val, int64_t B, int64_t nnz, int K,
                           const double* __restrict__ A, int64_t warps,
                           double* __restrict__ part) {
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kCsrBackwardWarps + (threadIdx.x >> 5);
  if (w >= warps) return;  // (warp-uniform)
  for (int k = lane; k < K; k += 32) part[w * K + k] = 0.0;
  const int64_t b_end = min(B, (w + 1) * kCsrRowsPerWarp);
  for (int64_t b = w * kCsrRowsPerWarp; b < b_end; ++b) {
    int64_t j0, j1;
    const bool range_ok = csr_row_range(crow, b, nnz, j0, j1);
    double lane_N = 0.0;
    bool lane_ok = true;
    for (int64_t j = j0 + lane; j < j1; j += 32) {
      const value_t x = __ldg(val + j);
      lane_ok = lane_ok && is_valid_count(static_cast<T>(x));
      lane_N += static_cast<double>(x);
    }
    double N = warp_allsum(lane_N);
    if (!(__all_sync(0xffffffffu, lane_ok) && range_ok)) N = static_cast<double>(NAN);
    for (int k = lane; k < K; k += 32) {
      const double g = static_cast<double>(grad[b * K + k]);
      if (g != 0.0) part[w * K + k] += N == N ? g * dpoch<double>(A[k], N) : static_cast<double>(NAN);
    }
  }
}

// S[k] = sum of part[w * K + k] over w in order of a fixed tree: block k,
// thread t sums w = t, t + 256, ...; then the 256 partial sums in order.
// NaN where A_k is (a non-finite log_alpha of k makes its gradient NaN).
__global__ void __launch_bounds__(kCsrSumThreads)
    csr_sum_weights_kernel(const double* __restrict__ part, int64_t warps, int K,
                           const double* __restrict__ A, double* __restrict__ S) {
  const int k = blockIdx.x;
  double s = 0.0;
  for (int64_t w = threadIdx.x; w < warps; w += kCsrSumThreads) s += part[w * K + k];
  __shared__ double t[kCsrSumThreads];
  t[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int i = 0; i < kCsrSumThreads; ++i) total += t[i];
    S[k] = A[k] == A[k] ? total : static_cast<double>(NAN);
  }
}

// grad_la[k * V + v] = sum over column v's nonzeros j (row r, in
// increasing r) of g[r, k] adpoch(a_kv, n_j) - a_kv S_k: a warp per column,
// lanes striding over its nonzeros, a fixed tree across the lanes.
template <typename T, typename value_t, typename index_t>
__global__ void __launch_bounds__(kCsrBackwardWarps * 32)
    csr_column_grad_kernel(const T* __restrict__ grad, const index_t* __restrict__ csc_ptr,
                           const index_t* __restrict__ csc_row, const value_t* __restrict__ csc_val,
                           int64_t B, int64_t nnz, int64_t V, int K,
                           const CsrColumn<T>* __restrict__ cols, const double* __restrict__ S,
                           T* __restrict__ grad_la) {
  const int lane = threadIdx.x & 31;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kCsrBackwardWarps + (threadIdx.x >> 5);
  if (v >= V) return;  // (warp-uniform)
  int64_t j0 = static_cast<int64_t>(__ldg(csc_ptr + v));
  int64_t j1 = static_cast<int64_t>(__ldg(csc_ptr + v + 1));
  const bool range_ok = 0 <= j0 && j0 <= j1 && j1 <= nnz;
  if (!range_ok) j0 = j1 = 0;
  for (int k = 0; k < K; ++k) {
    const CsrColumn<T> cs = load_csr_column(cols + v * K + k);
    double c = 0.0;
    bool lane_ok = true;
    for (int64_t j = j0 + lane; j < j1; j += 32) {
      const int64_t r = static_cast<int64_t>(__ldg(csc_row + j));
      const T n = static_cast<T>(__ldg(csc_val + j));
      if (r < 0 || r >= B) {
        lane_ok = false;
        continue;
      }
      // (A bad count's row has N NaN: S_k and so the gradient are NaN.)
      if (n == T(0) || !is_valid_count(n)) continue;
      const double g = static_cast<double>(grad[r * K + k]);
      if (g != 0.0) c += g * static_cast<double>(adpoch(cs.factors(), cs.a, n));
    }
    c = warp_sum(c);
    const bool ok = __all_sync(0xffffffffu, lane_ok) && range_ok;
    if (lane == 0) {
      grad_la[static_cast<int64_t>(k) * V + v] = static_cast<T>(
          ok ? c - static_cast<double>(cs.a) * S[k] : static_cast<double>(NAN));
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
