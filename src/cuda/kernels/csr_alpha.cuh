// Per-(column, component) concentration state for the CSR kernels and the
// totals A_k, computed once per call (no exp or division per nonzero), and
// the forward's table of lnpoch over the exact counts. See Note [CSR inputs]
// and Note [CSR tables].
#pragma once

#include "alpha_prep.cuh"
#include "ceil_div.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// alpha, log alpha and the exact-path factors: one 16-byte gather per
// nonzero in float32. Laid out (V, K): a nonzero's K components adjacent.
template <typename T>
struct alignas(4 * sizeof(T)) CsrColumn {
  T a, log_a, base, step;

  __device__ __forceinline__ ExactFactors<T> factors() const {
    return {base, step, a < Tuning<T>::kStirlingMin};
  }
};

template <typename T>
__device__ __forceinline__ CsrColumn<T> load_csr_column(const CsrColumn<T>* p) {
  CsrColumn<T> c;
  if constexpr (sizeof(T) == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    c.a = x.x, c.log_a = x.y, c.base = x.z, c.step = x.w;
  } else {
    const double2 x0 = __ldg(reinterpret_cast<const double2*>(p));
    const double2 x1 = __ldg(reinterpret_cast<const double2*>(p) + 1);
    c.a = x0.x, c.log_a = x0.y, c.base = x1.x, c.step = x1.y;
  }
  return c;
}

// The CSR forward's table: lnpoch(a_kc, n) for n = 1 .. kMaxExactCount,
// laid out (V, n, Kt), so that one nonzero's K components are adjacent; Kt
// >= K entries a (column, count), those past K zero (csr_table_stride).
constexpr int kCsrTableCounts = kMaxExactCount;

__host__ __device__ __forceinline__ int64_t csr_table_index(int64_t c, int n, int Kt) {
  return (c * kCsrTableCounts + (n - 1)) * Kt;
}

// Entry (c, n, k) = lnpoch(a_kc, n), n = 1 .. kMaxExactCount, from the exact
// path's running products, a cancelling one recomputed in float64: the
// value lnpoch_exact_checked gives (the dense tables' entries before log n!).
// A thread per entry, so that the fill spreads over the whole GPU (it is on
// the forward's critical path). log_alpha (K, V).
template <typename T>
__global__ void __launch_bounds__(256)
    csr_table_fill_kernel(const T* __restrict__ log_alpha, int64_t V, int K, int Kt,
                          T* __restrict__ tab) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= V * Kt * kCsrTableCounts) return;
  // i = (c * kCsrTableCounts + n - 1) * Kt + k: the table's own order, so
  // the stores are coalesced.
  const int k = static_cast<int>(i % Kt);
  if (k >= K) {
    tab[i] = T(0);
    return;
  }
  const int64_t cn = i / Kt;
  const int n = static_cast<int>(cn % kCsrTableCounts) + 1;
  const int64_t c = cn / kCsrTableCounts;
  const T la = log_alpha[static_cast<int64_t>(k) * V + c];
  const ExactFactors<T> f = exact_factors(dm_exp(la));
  ExactRun<T> run;  // after factors 1 .. n - 1
#pragma unroll 1
  for (int m = 1; m < n; ++m) exact_run_step(f, m, run);
  T r = exact_run_lnpoch(run, f, la, n);
  if (lnpoch_exact_cancels(la, n, r)) {
    r = static_cast<T>(lnpoch_exact_refined(static_cast<double>(la), n));
  }
  tab[i] = r;
}

constexpr int kCsrPrepThreads = 256;
constexpr int kCsrMaxPrepBlocks = 32;

inline int csr_prep_blocks(int64_t V) {
  return static_cast<int>(std::min<int64_t>(
      kCsrMaxPrepBlocks, std::max<int64_t>(1, ceil_div(V, kCsrPrepThreads))));
}

// grid (nblk, K): block (blk, k) fills the columns v = blk * 256 + t, +
// nblk * 256, ... of component k and writes their alpha sum to
// Apart[k * nblk + blk] (NaN if any log_alpha there is not finite). The
// order depends on (V, nblk) only.
template <typename T>
__global__ void __launch_bounds__(kCsrPrepThreads)
    csr_alpha_prep_kernel(const T* __restrict__ log_alpha, int64_t V, int K,
                          CsrColumn<T>* __restrict__ cols, double* __restrict__ Apart) {
  const int blk = blockIdx.x, nblk = gridDim.x, k = blockIdx.y;
  double s = 0.0;
  bool finite = true;
  for (int64_t v = static_cast<int64_t>(blk) * kCsrPrepThreads + threadIdx.x; v < V;
       v += static_cast<int64_t>(nblk) * kCsrPrepThreads) {
    const T la = log_alpha[static_cast<int64_t>(k) * V + v];
    const T a = dm_exp(la);
    const ExactFactors<T> f = exact_factors(a);
    cols[v * K + k] = {a, la, f.base, f.step};
    s += static_cast<double>(a);
    finite = finite && is_finite(la);
  }
  __shared__ double warp_part[kCsrPrepThreads / 32];
  __shared__ int warp_finite[kCsrPrepThreads / 32];
  s = warp_sum(s);
  const int all_finite = __all_sync(0xffffffffu, finite);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) warp_part[w] = s, warp_finite[w] = all_finite;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    bool fin = true;
    for (int i = 0; i < kCsrPrepThreads / 32; ++i) t += warp_part[i], fin = fin && warp_finite[i];
    Apart[static_cast<int64_t>(k) * nblk + blk] = fin ? t : static_cast<double>(NAN);
  }
}

// log_A[k] = log of the sum of Apart[k * nblk ..] in order, or the
// log-sum-exp of log_alpha's row k where that sum is out of range (See Note
// [Log-space totals]); one thread per component.
template <typename T>
__global__ void csr_alpha_totals_kernel(const double* __restrict__ Apart, int nblk, int K,
                                        const T* __restrict__ log_alpha, int64_t V,
                                        double* __restrict__ log_A) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= K) return;
  double t = 0.0;
  for (int i = 0; i < nblk; ++i) t += Apart[static_cast<int64_t>(k) * nblk + i];
  log_A[k] = row_log_total(t, log_alpha + static_cast<int64_t>(k) * V, V);
}

// Row b's nonzeros [j0, j1); false (and an empty range) when the offsets
// are not a range of the nonzeros.
template <typename index_t>
__device__ __forceinline__ bool csr_row_range(const index_t* __restrict__ crow, int64_t b,
                                              int64_t nnz, int64_t& j0, int64_t& j1) {
  j0 = static_cast<int64_t>(__ldg(crow + b));
  j1 = static_cast<int64_t>(__ldg(crow + b + 1));
  const bool ok = 0 <= j0 && j0 <= j1 && j1 <= nnz;
  if (!ok) j0 = j1 = 0;
  return ok;
}

}  // namespace cuda
}  // namespace dirmult
