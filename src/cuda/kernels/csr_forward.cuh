// The CSR forward: a warp per row (batch-invariant: a row's sum order
// depends on its own nonzeros only), lanes striding over its nonzeros, alpha
// gathered through the read-only cache. See Note [CSR inputs].
#pragma once

#include "csr_alpha.cuh"

namespace dirmult {
namespace cuda {

constexpr int kCsrRowsPerBlock = 8;  // warps of 32 lanes, a row each

// out[b * K + k] = sum over row b's nonzeros of lnpoch(a_kc, n) [- log n!]
// - lnpoch(A_k, N_b) [+ log N_b!]; NaN for a bad count, a column outside
// [0, V), offsets outside the nonzeros, or a non-finite log_alpha of k.
template <typename T, typename value_t, typename index_t>
__global__ void __launch_bounds__(kCsrRowsPerBlock * 32)
    csr_forward_kernel(const index_t* __restrict__ crow, const index_t* __restrict__ col,
                       const value_t* __restrict__ val, int64_t B, int64_t nnz, int64_t V, int K,
                       const CsrColumn<T>* __restrict__ cols, const double* __restrict__ A,
                       bool normalize, T* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kCsrRowsPerBlock + (threadIdx.x >> 5);
  if (b >= B) return;  // (warp-uniform)
  int64_t j0, j1;
  bool ok = csr_row_range(crow, b, nnz, j0, j1);
  double N = 0.0;
  for (int k = 0; k < K; ++k) {
    double s = 0.0, lane_N = 0.0;
    bool lane_ok = true;
    for (int64_t j = j0 + lane; j < j1; j += 32) {
      const int64_t c = static_cast<int64_t>(__ldg(col + j));
      const value_t x = __ldg(val + j);
      const T n = static_cast<T>(x);
      if (c < 0 || c >= V || !is_valid_count(n)) {
        lane_ok = false;
        continue;
      }
      if (n == T(0)) continue;
      lane_N += static_cast<double>(x);
      const CsrColumn<T> cs = load_csr_column(cols + c * K + k);
      s += static_cast<double>(lnpoch(cs.factors(), cs.a, cs.log_a, n));
      if (normalize) s -= static_cast<double>(log_factorial(n));
    }
    if (k == 0) {
      N = warp_sum(lane_N);
      ok = __all_sync(0xffffffffu, lane_ok) && ok;
    }
    s = warp_sum(s);
    if (lane == 0) {
      const double Ak = A[k];
      double r = static_cast<double>(NAN);
      if (ok && Ak == Ak) {
        r = s - lnpoch<double>(Ak, log(Ak), N);
        if (normalize) r += log_factorial<double>(N);
      }
      out[b * K + k] = static_cast<T>(r);
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
