// finish_rows_kernel: the rows' values from their chunk partials.
#pragma once

#include "alpha_prep.cuh"
#include "row_chunks.cuh"
#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// Sums the chunk partials of each (row, component) in a fixed order: a
// thread per pair for a few chunks, a warp per pair (lanes splitting the
// chunks, see warp_ordered_sum) for many. per_sample: A comes from the
// partials (log_alpha (B, V) for its log-sum-exp where it is out of range);
// else from Apart.
constexpr int64_t kMaxChunksPerThread = 32;

__host__ __device__ inline int64_t finish_pairs_per_block(int64_t num_chunks) {
  return num_chunks <= kMaxChunksPerThread ? 256 : 8;
}

// Finishes pair i = (row, component) from its chunk partials: by the
// calling thread alone (per_thread) or by the calling warp (every lane
// calls it with the same i), in finish_rows_kernel's order, so that a
// kernel finishing its own rows (forward_table_fill_ring_kernel) gives the
// same bits.
template <typename scalar_t>
__device__ __forceinline__ void finish_pair(const RowPartial* __restrict__ partial,
                                            const double* __restrict__ Apart, int nblk_alpha,
                                            const scalar_t* __restrict__ log_alpha, int64_t V,
                                            int64_t i, int K, int64_t num_chunks, bool per_sample,
                                            bool normalize, bool per_thread,
                                            scalar_t* __restrict__ out) {
  const int64_t b = i / K;
  const int k = static_cast<int>(i % K);
  const RowPartial* p = partial + b * num_chunks * K + k;
  // A warp: alpha's partial totals in flight with the row's partials; a
  // thread alone: after them (each measured faster, BENCHMARKS.md).
  AlphaTotal alpha;
  if (!per_sample && !per_thread) alpha.load(Apart, k, nblk_alpha);
  double s = 0.0, N = 0.0, norm = 0.0, A = 0.0;
  // The four fields in one pass, several partials' loads in flight (a
  // pass per field, as warp_ordered_sum, waits for the L2 four times as
  // often); each field is summed in the same order either way.
  auto add = [&](const RowPartial& r) { s += r.s, N += r.n, norm += r.norm, A += r.a; };
  if (per_thread) {
#pragma unroll 8
    for (int64_t c = 0; c < num_chunks; ++c) add(p[c * K]);
  } else {
    // Lane l takes chunks l, l + 32, ..., then the fixed shuffle tree
    // (warp_ordered_sum's order).
#pragma unroll 8
    for (int64_t c = threadIdx.x & 31; c < num_chunks; c += 32) add(p[c * K]);
    s = warp_sum(s), N = warp_sum(N), norm = warp_sum(norm), A = warp_sum(A);
    if ((threadIdx.x & 31) != 0) return;
  }
  double log_A;
  if (per_sample) {
    log_A = row_log_total(A, log_alpha + b * V, V);
  } else {
    if (per_thread) alpha.load(Apart, k, nblk_alpha);
    log_A = log_of_alpha_total<scalar_t>(alpha.sum(), Apart, k, nblk_alpha);
  }
  out[i] = static_cast<scalar_t>(finish_row(s, N, norm, log_A, normalize));
}

template <typename scalar_t>
__global__ void __launch_bounds__(256)
    finish_rows_kernel(const RowPartial* __restrict__ partial, const double* __restrict__ Apart,
                       int nblk_alpha, const scalar_t* __restrict__ log_alpha, int64_t V,
                       int64_t B, int K, int64_t num_chunks, bool per_sample,
                       bool normalize, scalar_t* __restrict__ out) {
  const bool per_thread = num_chunks <= kMaxChunksPerThread;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * finish_pairs_per_block(num_chunks) +
                    (per_thread ? threadIdx.x : threadIdx.x >> 5);
  if (i >= B * K) return;
  finish_pair(partial, Apart, nblk_alpha, log_alpha, V, i, K, num_chunks, per_sample, normalize,
              per_thread, out);
}

}  // namespace cuda
}  // namespace dirmult
