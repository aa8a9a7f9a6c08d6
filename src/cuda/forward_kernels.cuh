// Forward kernels: one warp per (row, column chunk), one pass over the
// counts. Long rows with few rows ("wide") are split into chunks so the GPU
// has enough warps in flight; the chunk partials are then summed in a fixed
// order by finish_rows_kernel, so results are deterministic.
#pragma once

#include "alpha_prep.cuh"
#include "cuda_utils.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

constexpr int kRowWarps = 8;  // warps per block in the row kernels

struct alignas(16) RowPartial {  // 16-byte loads in finish_rows_kernel
  double s;     // sum_v lnpoch(alpha_v, n_v)      (NaN: bad count)
  double n;     // N
  double norm;  // -sum_v log n_v!                  (normalize only)
  double a;     // A for per-sample alpha
};

// The per-row terms that do not depend on the columns. A is NaN when a
// concentration is not finite: every row is NaN then, empty rows too (for
// which lnpoch(A, 0) would be 0).
__device__ __forceinline__ double finish_row(double s, double N, double norm, double A,
                                             bool normalize) {
  if (A != A) return A;
  double out = s - lnpoch<double>(A, log(A), N);
  if (normalize) out += log_factorial<double>(N) + norm;
  return out;
}

// How rows are split into chunks of columns; chunk_len is a multiple of 128
// (a warp's 32 lanes x 4 counts) so vector loads stay aligned.
struct RowSplit {
  int64_t chunk_len;
  int64_t num_chunks;
};

inline RowSplit split_rows(int64_t B, int64_t V) {
  // Enough (row, chunk) items for a large GPU (~64 warps x 132 SMs), but no
  // chunk shorter than 1024 columns. Depends on the shape only.
  const int64_t target_items = 8192;
  int64_t chunks = std::max<int64_t>(1, std::min(ceil_div(target_items, std::max<int64_t>(B, 1)),
                                                 ceil_div(V, 1024)));
  int64_t len = ceil_div(ceil_div(V, chunks), 128) * 128;
  return {len, ceil_div(V, len)};
}

// The (row, chunk) item of the calling warp in the row kernels' grid, and
// its columns [v_begin, v_end). valid: false past the last item.
struct RowItem {
  int64_t b, c, v_begin, v_end;
  bool valid;
};

__device__ __forceinline__ RowItem row_item(const RowSplit& split, int64_t B, int64_t V) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  // (A row of one chunk skips the 64-bit division, a call of ~70 instructions.)
  const int64_t nc = split.num_chunks;
  const int64_t b = nc == 1 ? item : item / nc, c = nc == 1 ? 0 : item % nc;
  const int64_t v_begin = c * split.chunk_len;
  return {b, c, v_begin, min(V, v_begin + split.chunk_len), item < B * split.num_chunks};
}

// Lane 0's result for (row, chunk, component k of K): the finished value when
// the row is one chunk, else the chunk's partial for finish_rows_kernel.
template <typename scalar_t>
__device__ __forceinline__ void write_row_result(const RowItem& it, const RowSplit& split, int K,
                                                 int k, double s, double N, double norm,
                                                 double A, bool normalize,
                                                 scalar_t* __restrict__ out,
                                                 RowPartial* __restrict__ partial) {
  if (split.num_chunks == 1) {
    out[it.b * K + k] = static_cast<scalar_t>(finish_row(s, N, norm, A, normalize));
  } else {
    partial[(it.b * split.num_chunks + it.c) * K + k] = {s, N, norm, A};
  }
}

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
// and finish were ~15% of the per-sample forward's instructions.
template <typename scalar_t>
__device__ __forceinline__ void write_per_sample_rows(const RowSplit& split, int64_t B,
                                                      double acc, double N, double norm,
                                                      double A, bool ok, bool normalize,
                                                      scalar_t* __restrict__ out,
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
      out[item] = static_cast<scalar_t>(finish_row(a, v[1], v[2], v[3], normalize));
    } else {
      partial[item] = {a, v[1], v[2], v[3]};
    }
  }
}

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
        const double A = split.num_chunks == 1 ? alpha_total(Apart, kb + k, nblk_alpha) : 0.0;
        write_row_result(it, split, K, kb + k, row_ok ? acc[k] : NAN, N, norm, A, normalize, out,
                         partial);
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

// Small problems with shared alpha (forward_small_applies): one launch and no
// scratch memory, since their time is host time (a launch and an allocation
// each). Every block prepares alpha into shared memory itself, exactly as
// alpha_prep_kernel would (the same A, bit for bit), then a warp per row.
constexpr int64_t kSmallMaxElements = int64_t{1} << 18;
// Its rows are a warp each on the math path, whose time grows with the
// row's length (a lane's counts one after the other, each to the warp's
// slowest). Float32 rows longer than kSmallMaxFloatColumns take the
// tables, one more launch and a scratch allocation: GPU time per call,
// small kernel -> tables (fourteenth session, BENCHMARKS.md), 8x512 17.8
// -> 6.5 us, 64x1000 33.6 -> 6.9 (they took the small kernel up to 1024
// columns before). Up to 256 columns the one launch stays for the host
// time of small calls (the seed shape's target), though the tables' GPU
// time is less there too (1x256 9.7 vs 6.1 us, 512x256 10.6 vs 7.5).
// Float64 has no tables: the math path either way.
constexpr int64_t kSmallMaxColumns = 1024;  // one chunk per row
constexpr int64_t kSmallMaxFloatColumns = 256;
static_assert(kRowWarps * 32 == kPrepThreads, "prep_alpha_slice's reduction order needs its block size");

template <typename scalar_t>
bool forward_small_applies(int64_t B, int64_t V) {
  const int64_t max_columns =
      std::is_same_v<scalar_t, float> ? kSmallMaxFloatColumns : kSmallMaxColumns;
  return V <= max_columns && B * V <= kSmallMaxElements;
}

template <typename scalar_t>
size_t forward_small_smem_bytes(int64_t V) {
  return V * sizeof(ColumnAlpha<scalar_t>) + prep_blocks(V) * sizeof(double);
}

template <typename scalar_t, typename count_t>
__global__ void __launch_bounds__(kRowWarps * 32)
    forward_small_kernel(const count_t* __restrict__ counts, const scalar_t* __restrict__ log_alpha,
                         int64_t B, int64_t V, int nblk, bool aligned, bool normalize,
                         scalar_t* __restrict__ out) {
  // (V) ColumnAlpha, then the nblk = prep_blocks(V) partial totals of A
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

// Per-sample alpha: log_alpha has counts' shape; A_b is summed on the way.
// Serves float64; float32 has forward_per_sample_float_kernel
// (per_sample_kernels.cuh), written to an instruction budget.
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
  write_per_sample_rows(split, B, acc, N, norm, A, ok, normalize, out, partial);
}

// Sums the chunk partials of each (row, component) in a fixed order: a
// thread per pair for a few chunks, a warp per pair (lanes splitting the
// chunks, see warp_ordered_sum) for many. per_sample: A comes from the
// partials; else from Apart.
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
                                            int64_t i, int K, int64_t num_chunks, bool per_sample,
                                            bool normalize, bool per_thread,
                                            scalar_t* __restrict__ out) {
  const int64_t b = i / K;
  const int k = static_cast<int>(i % K);
  const RowPartial* p = partial + b * num_chunks * K + k;
  // A warp: alpha's partial totals in flight with the row's partials (after
  // them, a second wait for the L2; sixteenth session, GPU time per call of
  // the fill-ring forward, with its rows spread over the SMs: wide 33.1 ->
  // 31.6 us, 40x210000 26.1 -> 25.3, 32x1048576 81.8 -> 76.7). A thread
  // alone: after them (1x32768 was 0.5 us slower with them in flight).
  AlphaTotal alpha;
  if (!per_sample && !per_thread) alpha.load(Apart, k, nblk_alpha);
  double s = 0.0, N = 0.0, norm = 0.0, A = 0.0;
  // The four fields in one pass, several partials' loads in flight (a
  // pass per field, as warp_ordered_sum, waited for the L2 four times as
  // often: wide's finish took 4.5 us); each field is summed in the same
  // order either way.
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
  if (!per_sample) {
    if (per_thread) alpha.load(Apart, k, nblk_alpha);
    A = alpha.sum();
  }
  out[i] = static_cast<scalar_t>(finish_row(s, N, norm, A, normalize));
}

template <typename scalar_t>
__global__ void __launch_bounds__(256)
    finish_rows_kernel(const RowPartial* __restrict__ partial, const double* __restrict__ Apart,
                       int nblk_alpha, int64_t B, int K, int64_t num_chunks, bool per_sample,
                       bool normalize, scalar_t* __restrict__ out) {
  const bool per_thread = num_chunks <= kMaxChunksPerThread;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * finish_pairs_per_block(num_chunks) +
                    (per_thread ? threadIdx.x : threadIdx.x >> 5);
  if (i >= B * K) return;
  finish_pair(partial, Apart, nblk_alpha, i, K, num_chunks, per_sample, normalize, per_thread,
              out);
}

template <typename scalar_t>
void launch_finish_rows(const RowPartial* partial, const double* Apart, int nblk_alpha, int64_t B,
                        int K, int64_t num_chunks, bool per_sample, bool normalize,
                        scalar_t* out, cudaStream_t stream) {
  finish_rows_kernel<scalar_t><<<ceil_div(B * K, finish_pairs_per_block(num_chunks)), 256, 0,
                                 stream>>>(partial, Apart, nblk_alpha, B, K, num_chunks,
                                           per_sample, normalize, out);
  DM_CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace dirmult
