// Per-column concentration state for shared alpha (K = 1) and mixture
// components (K > 1), computed once per call so the count kernels do no exp
// or division per element, and the concentration totals A_k.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ceil_div.cuh"
#include "dependent_launch.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// One column of one component: alpha, log alpha, and the exact-path factors.
template <typename T>
struct alignas(4 * sizeof(T)) ColumnAlpha {
  T a, log_a, base, step;

  __device__ __forceinline__ ExactFactors<T> factors() const {
    return {base, step, a < Tuning<T>::kStirlingMin};
  }
};

// Apart holds per component 2 nblk doubles: the slices' sums of alpha, then
// the slices' log-sum-exps of log_alpha, written only for a slice whose sum
// leaves the dtype's exp range (See Note [Log-space totals]).
__host__ __device__ constexpr int64_t apart_stride(int nblk) {
  return 2 * static_cast<int64_t>(nblk);
}

constexpr int kPrepThreads = 256;
// Partial totals per component; each is a fixed slice of columns, summed in
// order by alpha_log_total(), so A is the same bits in every kernel and run.
// A column per thread up to 32 blocks: the table kernels wait for this
// (a block of 1024 columns was slower: docs/PERFORMANCE_LEDGER.md).
constexpr int kMaxPrepBlocks = 32;
constexpr int kPrepColumnsPerBlock = 256;

inline int prep_blocks(int64_t V) {
  return static_cast<int>(
      std::min<int64_t>(kMaxPrepBlocks, std::max<int64_t>(1, ceil_div(V, kPrepColumnsPerBlock))));
}

// The prepared state of one column from its log-concentration: every kernel
// that needs it takes it from here (the same bits wherever it is made).
template <typename T>
__device__ __forceinline__ ColumnAlpha<T> column_alpha(T la) {
  const T a = dm_exp(la);
  const ExactFactors<T> f = exact_factors(a);
  return {a, la, f.base, f.step};
}

// Note [Log-space totals]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The kernels sum the dtype's exps of log_alpha in double (math.h, the
// concentration total). Where that sum leaves the dtype's exp range
// (total_out_of_range), log A is taken in log space instead: each slice of
// columns whose sum is out of range also stores the log-sum-exp of its
// log_alpha (one thread, out of line: a rare path), and alpha_log_total
// combines the slices' logs. Every kernel then holds log A alone (one
// double, as A was) and makes A = exp(log A) where it needs it
// (log_total): the row term lnpoch(A, N) from log A, and in the gradient
// the scaled forms where A is out of range (math.h, LogTotal). Rows of
// per-sample alpha take their own log-sum-exp the same way (row_log_total).

// log sum_v exp(la[v]) over v in [v0, v1), in double, by one thread (-inf
// for no columns).
template <typename scalar_t>
DM_RARE_PATH double slice_log_sum_exp(const scalar_t* __restrict__ la, int64_t v0, int64_t v1) {
  double m = -double(INFINITY);
  for (int64_t v = v0; v < v1; ++v) m = fmax(m, static_cast<double>(la[v]));
  if (!(m > -double(INFINITY) && m < double(INFINITY))) return m;
  double s = 0.0;
  for (int64_t v = v0; v < v1; ++v) s += exp(static_cast<double>(la[v]) - m);
  return m + log(s);
}

// log A of component k from its Apart (the slices' sums, then their
// log-sum-exps), where the sum A is out of range.
template <typename scalar_t>
__device__ __forceinline__ double slice_log(const double* __restrict__ part, int nblk, int i) {
  const double a = part[i];
  return total_out_of_range<scalar_t>(a) ? part[nblk + i] : log(a);
}

template <typename scalar_t>
DM_RARE_PATH double log_total_of_parts(const double* __restrict__ part, int nblk) {
  double m = -double(INFINITY);
  for (int i = 0; i < nblk; ++i) m = fmax(m, slice_log<scalar_t>(part, nblk, i));
  if (!(m > -double(INFINITY) && m < double(INFINITY))) return m;
  double s = 0.0;
  for (int i = 0; i < nblk; ++i) s += exp(slice_log<scalar_t>(part, nblk, i) - m);
  return m + log(s);
}

// Slice `blk` of `nblk` of component k by the calling thread's group of
// kPrepThreads threads (threads [g kPrepThreads, (g + 1) kPrepThreads) of
// a block of kGroups groups): cols for its columns (kCols), and
// Apart[k * apart_stride(nblk) + blk] = the
// sum of alpha over the slice, NaN if any log_alpha in it is not finite.
// Every thread of the block must call it (it syncs the block); a group
// with !active does nothing else. The sum's order depends on the group's
// size only, so A is the same bits whichever kernel computes it. Callers
// that call it again sync the block between calls (the warp totals are
// reused). kLoads: the loads a thread has in flight before it uses them
// (the sum's order is the same for any).
template <typename scalar_t, bool kCols, int kGroups, int kLoads = 8>
__device__ __forceinline__ void prep_alpha_slice_group(const scalar_t* __restrict__ log_alpha,
                                                       int64_t V, int k, int blk, int nblk,
                                                       ColumnAlpha<scalar_t>* __restrict__ cols,
                                                       double* __restrict__ Apart, bool active) {
  static_assert(kGroups >= 1 && kGroups * kPrepThreads <= 1024, "groups of one block");
  constexpr int kWarps = kPrepThreads / 32;
  const int group = kGroups == 1 ? 0 : threadIdx.x / kPrepThreads;
  const int t = kGroups == 1 ? threadIdx.x : threadIdx.x % kPrepThreads;
  const int64_t slice = ceil_div(V, nblk);
  const int64_t v0 = blk * slice, v1 = active ? min(V, v0 + slice) : v0;
  double total = 0.0;
  bool finite = true;
  auto take = [&](int64_t v, scalar_t la) {
    const ColumnAlpha<scalar_t> col = column_alpha(la);
    if constexpr (kCols) cols[k * V + v] = col;
    total += static_cast<double>(col.a);
    finite = finite && is_finite(la);
  };
  // Loads in flight before they are used: a slice of V / 32 columns is many
  // loads per thread for large V (8 in flight: docs/PERFORMANCE_LEDGER.md).
  // kPrepThreads, read at run time: with the constant, ptxas spilled (the
  // same code, 40 registers and 8 bytes of stack instead of 48 registers).
  const unsigned stride = blockDim.x / kGroups;
  int64_t v = v0 + t;
  for (; v + (kLoads - 1) * static_cast<int64_t>(stride) < v1; v += kLoads * stride) {
    scalar_t la[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) la[u] = log_alpha[k * V + v + u * stride];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) take(v + u * stride, la[u]);
  }
  // The rest (fewer than kLoads columns). With many loads per thread (the
  // fill ring's 32: its slices are often shorter), their loads in flight
  // together too; else one at a time (unrolled, forward_small_kernel's
  // single column per thread spilled).
  if constexpr (kLoads <= 8) {
    for (; v < v1; v += stride) take(v, log_alpha[k * V + v]);
  } else if (v < v1) {
    scalar_t la[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      la[u] = v + u * stride < v1 ? log_alpha[k * V + v + u * stride] : scalar_t(0);
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (v + u * stride < v1) take(v + u * stride, la[u]);
    }
  }
  __shared__ double warp_totals[kGroups][kWarps];
  __shared__ int warp_finite[kGroups][kWarps];
  total = warp_sum(total);
  const int all_finite = __all_sync(0xffffffffu, finite);
  const int lane = threadIdx.x & 31, warp = t >> 5;
  if (lane == 0) {
    warp_totals[group][warp] = total;
    warp_finite[group][warp] = all_finite;
  }
  __syncthreads();
  if (active && t == 0) {
    double s = 0.0;
    bool ok = true;
    for (int w = 0; w < kWarps; ++w) {
      s += warp_totals[group][w];
      ok = ok && warp_finite[group][w];
    }
    Apart[k * apart_stride(nblk) + blk] = ok ? s : NAN;
    if (ok && total_out_of_range<scalar_t>(s)) {
      Apart[k * apart_stride(nblk) + nblk + blk] = slice_log_sum_exp(log_alpha + k * V, v0, v1);
    }
  }
}

// Block `blk` of `nblk` of component k, in a block of kPrepThreads threads:
// cols for its slice of the columns and its partial total (above).
template <typename scalar_t>
__device__ __forceinline__ void prep_alpha_slice(const scalar_t* __restrict__ log_alpha, int64_t V,
                                                 int k, int blk, int nblk,
                                                 ColumnAlpha<scalar_t>* __restrict__ cols,
                                                 double* __restrict__ Apart) {
  prep_alpha_slice_group<scalar_t, true, 1>(log_alpha, V, k, blk, nblk, cols, Apart, true);
}

// grid (prep_blocks(V), K): prep_alpha_slice for every block.
template <typename scalar_t>
__global__ void __launch_bounds__(kPrepThreads)
    alpha_prep_kernel(const scalar_t* __restrict__ log_alpha, int64_t V,
                      ColumnAlpha<scalar_t>* __restrict__ cols, double* __restrict__ Apart) {
  allow_dependent_launch();  // a dependent that fills its own table starts now
  prep_alpha_slice(log_alpha, V, blockIdx.y, blockIdx.x, gridDim.x, cols, Apart);
}

// The partial totals of component k loaded (load: the loads are
// independent), then summed in index order (sum), so that a caller can have
// them in flight beside its other loads.
struct AlphaTotal {
  double part[kMaxPrepBlocks];

  __device__ __forceinline__ void load(const double* __restrict__ Apart, int k, int nblk) {
#pragma unroll
    for (int i = 0; i < kMaxPrepBlocks; ++i) {
      part[i] = i < nblk ? Apart[k * apart_stride(nblk) + i] : 0.0;
    }
  }

  __device__ __forceinline__ double sum() const {
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < kMaxPrepBlocks; ++i) s += part[i];
    return s;
  }
};

// log A of component k from the sum A of its partial totals (NaN stays NaN;
// See Note [Log-space totals]).
template <typename scalar_t>
__device__ __forceinline__ double log_of_alpha_total(double A, const double* __restrict__ Apart,
                                                     int k, int nblk) {
  if (!total_out_of_range<scalar_t>(A)) return log(A);
  return log_total_of_parts<scalar_t>(Apart + k * apart_stride(nblk), nblk);
}

template <typename scalar_t>
__device__ __forceinline__ double alpha_log_total(const double* __restrict__ Apart, int k,
                                                  int nblk) {
  AlphaTotal t;
  t.load(Apart, k, nblk);
  return log_of_alpha_total<scalar_t>(t.sum(), Apart, k, nblk);
}

// log A of a row of per-sample alpha from its summed exps A, with the row's
// log_alpha (V,) for the log-sum-exp where A is out of range.
template <typename scalar_t>
__device__ __forceinline__ double row_log_total(double A, const scalar_t* __restrict__ lrow,
                                                int64_t V) {
  if (!total_out_of_range<scalar_t>(A)) return log(A);
  return slice_log_sum_exp(lrow, 0, V);
}

// a_v / A for a total out of range, out of line (the kernels' tails).
template <typename scalar_t>
DM_RARE_PATH double scaled_column_factor(scalar_t log_a, double log_A) {
  return exp(static_cast<double>(log_a) - log_A);
}

// The total from log A (See Note [Log-space totals]): A = exp(log A), scaled
// where A is out of the dtype's range: below TotalRange's minimum or above
// its largest finite value (a float32 total in double's range can exceed
// float's, and its columns' a_v, float exps, are then infinite). The same
// log A gives the same total in every kernel.
template <typename scalar_t>
__device__ __forceinline__ LogTotal log_total(double log_A) {
  const double A = exp(log_A);
  const double max_finite =
      std::is_same_v<scalar_t, float> ? 0x1.fffffep127 : 0x1.fffffffffffffp1023;
  return {A, log_A, total_out_of_range<scalar_t>(A) || A > max_finite};
}

}  // namespace cuda
}  // namespace dirmult
