// The forward of per-sample alpha ((B, V) log_alpha) on the math path
// (float64; float32: per_sample_forward_float.cuh), and the per-sample
// kernels' end of a block: its rows' sums and finish.
#pragma once

#include "alpha_prep.cuh"
#include "row_chunks.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// The sums of four doubles over the warp, transposed: every lane gets the
// sum of value 2 * bit 4 + bit 3 of its lane (lane 0: v0, 8: v1, 16: v2,
// 24: v3). The first two levels exchange only the values a lane keeps
// (three shuffles of doubles in place of eight), the rest is warp_allsum's
// butterfly; a fixed order, and the lanes of a group of 8 hold the same bits.
// Warp-uniform call.
__device__ __forceinline__ double warp_sum4_transposed(double v0, double v1, double v2, double v3) {
  const int lane = threadIdx.x & 31;
  const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0;
  double k0 = hi16 ? v2 : v0, k1 = hi16 ? v3 : v1;
  k0 += __shfl_xor_sync(0xffffffffu, hi16 ? v0 : v2, 16);
  k1 += __shfl_xor_sync(0xffffffffu, hi16 ? v1 : v3, 16);
  double k = hi8 ? k1 : k0;
  k += __shfl_xor_sync(0xffffffffu, hi8 ? k0 : k1, 8);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
  return k;
}

// The per-sample kernels' end, for the whole block (every thread calls it,
// its warps' items valid or not): each warp's four sums go to shared memory
// (warp_sum4_transposed), then the block's first kRowWarps threads write an
// item each: its row's value (finish_row) where the row is one chunk, else
// the chunk's partial for finish_rows_kernel (write_row_result's layout: an
// item is row * num_chunks + chunk). finish_row's float64 lgammas run once
// per thread instead of once per warp: at 1024 columns a row's reductions
// and finish were ~15% of the per-sample forward's instructions. log_alpha
// (B, V): a finished row's log-sum-exp where its A is out of range.
template <typename scalar_t>
__device__ __forceinline__ void write_per_sample_rows(const RowSplit& split, int64_t B,
                                                      double acc, double N, double norm,
                                                      double A, bool ok, bool normalize,
                                                      const scalar_t* __restrict__ log_alpha,
                                                      int64_t V, scalar_t* __restrict__ out,
                                                      RowPartial* __restrict__ partial) {
  __shared__ double sums[kRowWarps][4];
  __shared__ bool sums_ok[kRowWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const double s = warp_sum4_transposed(acc, N, norm, A);
  const bool row_ok = __all_sync(0xffffffffu, ok);
  if ((lane & 7) == 0) sums[warp][lane >> 3] = s;
  if (lane == 0) sums_ok[warp] = row_ok;
  __syncthreads();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x;
  if (threadIdx.x < kRowWarps && item < B * split.num_chunks) {
    const double* v = sums[threadIdx.x];
    const double a = sums_ok[threadIdx.x] ? v[0] : NAN;
    if (split.num_chunks == 1) {
      const double log_A = row_log_total(v[3], log_alpha + item * V, V);
      out[item] = static_cast<scalar_t>(finish_row(a, v[1], v[2], log_A, normalize));
    } else {
      partial[item] = {a, v[1], v[2], v[3]};
    }
  }
}

// Per-sample alpha: log_alpha has counts' shape; A_b is summed on the way.
// Serves float64; float32 has forward_per_sample_float_kernel
// (per_sample_forward_float.cuh), written to an instruction budget.
template <typename scalar_t, typename count_t>
__global__ void __launch_bounds__(kRowWarps * 32)
    forward_rows_per_sample_kernel(const count_t* __restrict__ counts,
                                   const scalar_t* __restrict__ log_alpha, int64_t B, int64_t V,
                                   RowSplit split, bool aligned, bool normalize,
                                   scalar_t* __restrict__ out, RowPartial* __restrict__ partial) {
  const int lane = threadIdx.x & 31;
  const RowItem it = row_item(split, B, V);
  // (A warp past the last item runs no loads: the block finishes together.)
  const int64_t v_begin = it.v_begin, v_end = it.valid ? it.v_end : it.v_begin;
  const count_t* row = counts + it.b * V;
  const scalar_t* lrow = log_alpha + it.b * V;

  // Counts that need the slow math (off the exact path, or a float32 result
  // that cancels and is redone in float64) are deferred: each lane marks
  // them, and after every 8 loads the lanes take their own marked counts
  // together. Evaluated in place, a warp paid the slow path at nearly every
  // position where any of its 32 lanes needed it.
  constexpr int kGroup = 8;  // loads per deferral group: 4 * kGroup bits
  double acc = 0.0, N = 0.0, norm = 0.0, A = 0.0;
  bool ok = true;
  unsigned slow = 0;  // bit 4 (load % kGroup) + j
  int load = 0;  // this lane's loads so far
  for (int64_t v = v_begin + 4 * lane; v < v_end; v += 128, ++load) {
    scalar_t n[4], la[4];
    double exact[4], unused[4];
    load_counts<scalar_t, count_t>(row, v, v_end, aligned, n, exact);
    load_counts<scalar_t, scalar_t>(lrow, v, v_end, aligned, la, unused);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (v + j >= v_end) continue;
      const scalar_t a = dm_exp(la[j]);
      ok = ok && is_finite(la[j]);
      A += static_cast<double>(a);
      if (n[j] == scalar_t(0)) continue;
      ok = ok && is_valid_count(n[j]);
      N += exact[j];
      if (normalize) norm -= static_cast<double>(log_factorial(n[j]));
      if (is_exact_count(n[j])) {
        const int m = static_cast<int>(n[j]);
        const scalar_t r = lnpoch_exact(exact_factors(a), la[j], m);
        if (!lnpoch_exact_cancels(la[j], m, r)) {
          acc += static_cast<double>(r);
          continue;
        }
      }
      if (is_valid_count(n[j])) slow |= 1u << (4 * (load % kGroup) + j);
    }
    if (load % kGroup == kGroup - 1 || v + 128 >= v_end) {
      const int64_t group_v = v - 128 * (load % kGroup);
#pragma unroll 1
      while (slow != 0) {
        const int e = __ffs(static_cast<int>(slow)) - 1;
        slow &= slow - 1;
        const int64_t vv = group_v + 128 * (e >> 2) + (e & 3);
        const scalar_t x = static_cast<scalar_t>(row[vv]), l = lrow[vv];
        acc += static_cast<double>(lnpoch(dm_exp(l), l, x));
      }
    }
  }
  write_per_sample_rows(split, B, acc, N, norm, A, ok, normalize, log_alpha, V, out, partial);
}

}  // namespace cuda
}  // namespace dirmult
