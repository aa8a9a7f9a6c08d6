// The math-path forward of shared or per-component alpha: a warp per (row,
// chunk), one pass over the counts (forward_rows_kernel), and the one-launch
// forward of small problems (forward_small_kernel).
#pragma once

#include "alpha_prep.cuh"
#include "row_chunks.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// The calling warp's (row, chunk) item of the math path, shared or
// per-component alpha: cols is (K, V) (global or shared memory). out is
// (B, K) when the row is one chunk, else partial is (B, num_chunks, K).
template <typename scalar_t, typename count_t, int KB>
__device__ __forceinline__ void forward_row_item(const RowItem& it, const count_t* __restrict__ counts,
                                                 const ColumnAlpha<scalar_t>* __restrict__ cols,
                                                 const double* __restrict__ Apart, int nblk_alpha,
                                                 int64_t V, int K, const RowSplit& split,
                                                 bool aligned, bool normalize,
                                                 scalar_t* __restrict__ out,
                                                 RowPartial* __restrict__ partial) {
  const int lane = threadIdx.x & 31;
  const int64_t v_begin = it.v_begin, v_end = it.v_end;
  const count_t* row = counts + it.b * V;

  for (int kb = 0; kb < K; kb += KB) {
    double acc[KB];
#pragma unroll
    for (int k = 0; k < KB; ++k) acc[k] = 0.0;
    double N = 0.0, norm = 0.0;
    bool ok = true;
    for (int64_t v = v_begin + 4 * lane; v < v_end; v += 128) {
      scalar_t n[4];
      double exact[4];
      load_counts<scalar_t, count_t>(row, v, v_end, aligned, n, exact);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (n[j] == scalar_t(0)) continue;
        ok = ok && is_valid_count(n[j]);
        N += exact[j];
        if (normalize) norm -= static_cast<double>(log_factorial(n[j]));
#pragma unroll
        for (int k = 0; k < KB; ++k) {
          if (kb + k < K) {
            const ColumnAlpha<scalar_t> col = cols[(kb + k) * V + v + j];
            acc[k] += static_cast<double>(lnpoch(col.factors(), col.a, col.log_a, n[j]));
          }
        }
      }
    }
    N = warp_sum(N);
    norm = warp_sum(norm);
    const bool row_ok = __all_sync(0xffffffffu, ok);
#pragma unroll
    for (int k = 0; k < KB; ++k) acc[k] = warp_sum(acc[k]);
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < KB; ++k) {
        if (kb + k >= K) continue;
        const double log_A =
            split.num_chunks == 1 ? alpha_log_total<scalar_t>(Apart, kb + k, nblk_alpha) : 0.0;
        write_row_result(it, split, K, kb + k, row_ok ? acc[k] : NAN, N, norm, log_A, normalize,
                         out, partial);
      }
    }
  }
}

template <typename scalar_t, typename count_t, int KB>
__global__ void __launch_bounds__(kRowWarps * 32)
    forward_rows_kernel(const count_t* __restrict__ counts,
                        const ColumnAlpha<scalar_t>* __restrict__ cols,
                        const double* __restrict__ Apart, int nblk_alpha, int64_t B, int64_t V,
                        int K, RowSplit split, bool aligned, bool normalize,
                        scalar_t* __restrict__ out, RowPartial* __restrict__ partial) {
  const RowItem it = row_item(split, B, V);
  if (!it.valid) return;
  forward_row_item<scalar_t, count_t, KB>(it, counts, cols, Apart, nblk_alpha, V, K, split,
                                          aligned, normalize, out, partial);
}

// Small problems with shared alpha (forward_small_applies, policy.h): one
// launch and no scratch memory, since their time is host time (a launch and
// an allocation each). Every block prepares alpha into shared memory itself,
// exactly as alpha_prep_kernel would (the same A, bit for bit), then a warp
// per row.
static_assert(kRowWarps * 32 == kPrepThreads, "prep_alpha_slice's reduction order needs its block size");

template <typename scalar_t>
size_t forward_small_smem_bytes(int64_t V) {
  return V * sizeof(ColumnAlpha<scalar_t>) + apart_stride(prep_blocks(V)) * sizeof(double);
}

template <typename scalar_t, typename count_t>
__global__ void __launch_bounds__(kRowWarps * 32)
    forward_small_kernel(const count_t* __restrict__ counts, const scalar_t* __restrict__ log_alpha,
                         int64_t B, int64_t V, int nblk, bool aligned, bool normalize,
                         scalar_t* __restrict__ out) {
  // (V) ColumnAlpha, then Apart (2 nblk, nblk = prep_blocks(V): alpha_prep.cuh)
  extern __shared__ __align__(32) unsigned char small_smem[];
  auto* cols = reinterpret_cast<ColumnAlpha<scalar_t>*>(small_smem);
  auto* Apart = reinterpret_cast<double*>(cols + V);
  for (int blk = 0; blk < nblk; ++blk) {
    prep_alpha_slice<scalar_t>(log_alpha, V, 0, blk, nblk, cols, Apart);
    __syncthreads();  // (its warp totals are reused by the next slice)
  }
  const RowSplit split{V, 1};
  const RowItem it = row_item(split, B, V);
  if (!it.valid) return;
  forward_row_item<scalar_t, count_t, 1>(it, counts, cols, Apart, nblk, V, 1, split, aligned,
                                         normalize, out, nullptr);
}

}  // namespace cuda
}  // namespace dirmult
