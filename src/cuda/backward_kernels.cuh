// Backward kernels.
//
// Shared alpha / components (one read of the counts):
//   grad_la[k, v] = sum_b G[b,k] adpoch(a_kv, n_bv) - a_kv * S_k,
//   S_k = sum_b G[b,k] dpoch(A_k, N_b).
// column_backward_kernel: a block owns 1024 columns x a tile of rows; each
//   thread keeps its 4 columns' alpha and sums in registers down the rows
//   (column sums need no cross-thread traffic); each warp writes its part of
//   the row totals N_b, summed in a fixed order by row_weights_kernel.
// row_weights_kernel: w[b,k] = G[b,k] dpoch(A_k, N_b), summed per block.
// column_finish_kernel: S_k = sum_b w[b,k]; grad = sum_tiles C - a S.
// Every reduction has a shape-determined order: bitwise reproducible.
//
// Per-sample alpha and the counts gradient are elementwise once the row
// totals are known: row_totals_kernel, then elementwise_backward_kernel
// (float32 per-sample alpha without a counts gradient:
// per_sample_backward_kernels.cuh).
//
// zero_weight_rows (shared and component alpha, CPU too): a row whose
// incoming gradient is exactly 0 does not enter the gradient, even with bad
// counts (no 0 * NaN), and column_backward_kernel does not read batches of
// such rows (8 consecutive rows of weight 0 are skipped unread: a mask
// that drops runs of rows saves their reads).
#pragma once

#include "alpha_prep.cuh"
#include "cuda_utils.cuh"
#include "dirmult/math.h"
#include "table_kernels.cuh"

namespace dirmult {
namespace cuda {

constexpr int kColThreads = 256;
constexpr int kColsPerBlock = 4 * kColThreads;
constexpr int kColWarps = kColThreads / 32;
constexpr int kRowBatch = 8;  // rows whose loads are in flight together

struct ColumnTiling {
  int64_t col_chunks;
  int64_t rows_per_tile;
  int64_t row_tiles;
};

// max_blocks: the blocks that are resident at once (one wave).
inline ColumnTiling tile_columns(int64_t B, int64_t V, int64_t k_blocks, int64_t max_blocks) {
  const int64_t col_chunks = ceil_div(V, kColsPerBlock);
  // A tile is a multiple of the row batch.
  const int64_t tiles = std::max<int64_t>(1, max_blocks / (col_chunks * k_blocks));
  int64_t rows = ceil_div(ceil_div(std::max<int64_t>(B, 1), tiles), kRowBatch) * kRowBatch;
  rows = std::max<int64_t>(rows, kRowBatch);
  return {col_chunks, rows, ceil_div(std::max<int64_t>(B, 1), rows)};
}

// A thread's 4 columns (base = counts + v0, v_end = columns left from v0)
// of the kRowBatch rows from b0, zeros past b_end and past V; all loads
// issued before any is used, so they are in flight together.
template <typename scalar_t, typename count_t>
__device__ __forceinline__ void load_row_batch(const count_t* __restrict__ base, int64_t V,
                                               int64_t b0, int64_t b_end, int64_t v_end,
                                               bool aligned, scalar_t (&n)[kRowBatch][4],
                                               double (&exact)[kRowBatch][4]) {
#pragma unroll
  for (int i = 0; i < kRowBatch; ++i) {
    if (b0 + i < b_end && v_end > 0) {
      load_counts<scalar_t, count_t>(base + (b0 + i) * V, 0, v_end, aligned, n[i], exact[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) n[i][j] = scalar_t(0), exact[i][j] = 0.0;
    }
  }
}

// grid (col_chunks, row_tiles, ceil(K / KB)).
// Cpart: (row_tiles, K, V) column partials. Npart: (B, col_chunks, kColWarps)
// row totals, a warp's 128 columns each (written by the blocks with
// blockIdx.z == 0; NaN marks a bad count). Warps never wait for each other
// after the table is staged: no block-wide reduction in the row loop.
// kTable (float, K == 1): adpoch of small integer counts comes from adp_table
// (see table_kernels.cuh), staged in shared memory for the block's columns;
// the hot loop is branch-free as in forward_table_kernel.
template <typename scalar_t, typename count_t, int KB, bool kTable>
__global__ void __launch_bounds__(kColThreads, kTable ? 3 : 1)
    column_backward_kernel(const scalar_t* __restrict__ grad, const count_t* __restrict__ counts,
                           const ColumnAlpha<scalar_t>* __restrict__ cols,
                           const float* __restrict__ adp_table, int64_t B, int64_t V, int K,
                           ColumnTiling tiling, bool aligned, double* __restrict__ Cpart,
                           double* __restrict__ Npart) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t chunk0 = blockIdx.x * static_cast<int64_t>(kColsPerBlock);
  const int64_t v0 = chunk0 + 4 * t;
  const int64_t b_begin = blockIdx.y * tiling.rows_per_tile;
  const int64_t b_end = min(B, b_begin + tiling.rows_per_tile);
  const int kb = blockIdx.z * KB;
  const bool row_totals = blockIdx.z == 0;
  const int64_t n_parts = tiling.col_chunks * kColWarps;  // Npart entries per row

  extern __shared__ float adp_tab[];
  if constexpr (kTable) {
    static_assert(kColsPerBlock == kTableChunk, "the table slot layout is per 1024 columns");
    stage_table_slice(adp_tab, adp_table, blockIdx.x);  // columns past V: entry 0 (= 0)
  }

  ColumnAlpha<scalar_t> col[KB][4];
#pragma unroll
  for (int k = 0; k < KB; ++k) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool in = kb + k < K && v0 + j < V;
      col[k][j] = in ? cols[(kb + k) * V + v0 + j] : ColumnAlpha<scalar_t>{1, 0, 1, 1};
    }
  }
  double acc[KB][4];
#pragma unroll
  for (int k = 0; k < KB; ++k)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[k][j] = 0.0;

  const count_t* base = counts + v0;
  const int64_t v_end = V - v0;  // columns left from v0
  // table_slot(4 t + j, n) = n * 1024 + j * 256 + t, read through its 32-bit
  // shared address (table_entry_at).
  const unsigned tq_at = static_cast<unsigned>(__cvta_generic_to_shared(adp_tab + t));
  for (int64_t b0 = b_begin; b0 < b_end; b0 += kRowBatch) {
    // A batch of rows whose incoming gradients are all 0 (every component:
    // the row totals serve them all) is not read: zero_weight_rows.
    // The batch's gradients are grad[b0 K, min(b_end, b0 + kRowBatch) K).
    bool zero_batch = true;
    if constexpr (kTable) {  // K == 1: unrolled, non-short-circuit: the loads issue together
#pragma unroll
      for (int i = 0; i < kRowBatch; ++i) {
        zero_batch &= b0 + i >= b_end || grad[b0 + i] == scalar_t(0);
      }
    } else {
      const int64_t g_end = min(b_end, b0 + kRowBatch) * K;
#pragma unroll 1
      for (int64_t i = b0 * K; i < g_end; ++i) zero_batch &= grad[i] == scalar_t(0);
    }
    if (zero_batch) {
      if (row_totals && lane == 0) {
        for (int64_t b = b0; b < min(b_end, b0 + kRowBatch); ++b) {
          Npart[b * n_parts + blockIdx.x * kColWarps + warp] = 0.0;
        }
      }
      continue;
    }
    scalar_t n[kRowBatch][4];
    double exact[kRowBatch][4];
    load_row_batch(base, V, b0, b_end, v_end, aligned, n, exact);
    unsigned rare = 0;  // kTable: counts off the table, bit 4 i + j
    float acc_batch[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // kTable: this batch's terms
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      const int64_t b = b0 + i;
      // This thread's part of N_b: table indices as integers, every other
      // count in float64 (NaN for a bad one).
      int table_n = 0;
      double other_n = 0.0;
      if constexpr (kTable) {
        const float g = b < b_end ? static_cast<float>(grad[b * K]) : 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int idx;
          const bool hit = table_index(n[i][j], idx);
          idx = hit ? idx : 0;
          table_n += idx;
          rare |= hit ? 0u : 1u << (4 * i + j);
          const float d = load_shared_float(table_entry_at(tq_at, idx, j * (kTableChunk / 4)));
          acc_batch[j] = fmaf(g, d, acc_batch[j]);
        }
      } else {
        double g[KB];
#pragma unroll
        for (int k = 0; k < KB; ++k) {
          g[k] = b < b_end ? static_cast<double>(grad[b * K + min(kb + k, K - 1)]) : 0.0;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const scalar_t x = n[i][j];
          if (x == scalar_t(0)) continue;
          other_n += is_valid_count(x) ? exact[i][j] : NAN;
#pragma unroll
          for (int k = 0; k < KB; ++k) {  // (a zero-weight row's bad count stays out)
            const double d = static_cast<double>(adpoch(col[k][j].factors(), col[k][j].a, x));
            acc[k][j] += g[k] == 0.0 ? 0.0 : g[k] * d;
          }
        }
      }
      if (row_totals && b0 + i < b_end) {
        double total = static_cast<double>(__reduce_add_sync(0xffffffffu, table_n));
        if constexpr (kTable) {
          // A warp-uniform branch, rarely taken: the row's counts off the
          // table, exactly, from memory (float64 counts are not exact in float).
          const unsigned row_rare = (rare >> (4 * i)) & 0xFu;
          if (__any_sync(0xffffffffu, row_rare != 0)) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if ((row_rare >> j) & 1u) {
                other_n += is_valid_count(n[i][j]) ? static_cast<double>(base[b * V + j]) : NAN;
              }
            }
            total += warp_sum(other_n);
          }
        } else {
          if (__any_sync(0xffffffffu, !(other_n == 0.0))) total += warp_sum(other_n);
        }
        if (lane == 0) Npart[b * n_parts + blockIdx.x * kColWarps + warp] = total;
      }
    }
    if constexpr (kTable) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][j] += static_cast<double>(acc_batch[j]);
      // Non-integer, large or bad counts: one rolled copy of the math path,
      // out of the unrolled loops (copies in them overflowed the instruction
      // cache). Bad counts are already NaN in N_b, which poisons the gradient.
      // Spread over the warp's lanes (spread_marks).
      if (__any_sync(0xffffffffu, rare != 0)) {
        struct Term {
          double d;
          int valid, unused;
        };
        auto compute = [&](int owner, int e) {
          const int i = e >> 2, j = e & 3;
          const int64_t v = 4 * (owner - lane) + j;  // the owner's column, from v0
          const scalar_t x = static_cast<scalar_t>(base[(b0 + i) * V + v]);
          if (!is_valid_count(x)) return Term{0.0, 0, 0};
          const ColumnAlpha<scalar_t> cl = cols[v0 + v];
          return Term{static_cast<double>(grad[(b0 + i) * K]) *
                          static_cast<double>(adpoch(cl.factors(), cl.a, x)),
                      1, 0};
        };
        auto consume = [&](int e, const Term& r) {
          const int j = e & 3;
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) acc[0][jj] += r.valid && jj == j ? r.d : 0.0;
        };
        spread_marks<Term>(rare, compute, consume);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < KB; ++k) {
    if (kb + k >= K) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (v0 + j < V) Cpart[(blockIdx.y * static_cast<int64_t>(K) + kb + k) * V + v0 + j] = acc[k][j];
    }
  }
}

// Wpart[k, blk] = sum over the block's rows b of w[b, k] = G[b, k] dpoch(A_k,
// N_b), N_b the sum of Npart[b, 0 .. parts) in a fixed order; grid
// (row_weights_blocks, K). A row's parts are summed by a thread (few parts),
// a warp or the whole block (many), rows_per_weight_block rows per block;
// the row's first thread finishes it. The block's rows are summed in a fixed
// order, and column_finish_kernel sums the block partials in order: S_k =
// sum_b w[b, k] without a launch of its own, bitwise reproducible.
constexpr int kWeightThreads = 256;
constexpr int64_t kMaxPartsPerThread = 32;
constexpr int64_t kMaxPartsPerWarp = 32 * 32;

__host__ __device__ inline int64_t rows_per_weight_block(int64_t parts) {
  return parts <= kMaxPartsPerThread ? kWeightThreads
         : parts <= kMaxPartsPerWarp ? kWeightThreads / 32
                                     : 1;
}

inline int64_t row_weights_blocks(int64_t B, int64_t parts) {
  return ceil_div(B, rows_per_weight_block(parts));
}

// The sum of x over the block's threads, in a fixed order; valid in thread 0.
__device__ __forceinline__ double block_sum(double x, double* __restrict__ warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // warp_sums may still be read from a previous call
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total += warp_sums[i];
  }
  return total;
}

// grad null: unit weights (G = 1, the gradient of the rows' sum). Lpart
// non-null (K == 1, log_lik_with_grad): the rows' lnpoch partials, laid out
// as Npart, summed the same way; out[b] = the row's log-likelihood.
template <typename scalar_t>
__global__ void __launch_bounds__(kWeightThreads)
    row_weights_kernel(const scalar_t* __restrict__ grad, const double* __restrict__ Npart,
                       int64_t parts, const double* __restrict__ Apart, int nblk_alpha,
                       int64_t B, int K, double* __restrict__ Wpart,
                       const double* __restrict__ Lpart, bool normalize,
                       scalar_t* __restrict__ out) {
  __shared__ double warp_sums[kWeightThreads / 32];
  const int k = blockIdx.y;
  const int64_t rows = rows_per_weight_block(parts);
  const int lanes = static_cast<int>(kWeightThreads / rows);  // threads per row: 1, 32 or 256
  const int64_t b = static_cast<int64_t>(blockIdx.x) * rows + threadIdx.x / lanes;
  const int sub = static_cast<int>(threadIdx.x) % lanes;
  double N = 0.0, L = 0.0;
  if (b < B) {
    for (int64_t p = sub; p < parts; p += lanes) {
      N += Npart[b * parts + p];
      if (Lpart != nullptr) L += Lpart[b * parts + p];
    }
  }
  if (lanes == 32) {  // b is the same in the whole warp: every lane takes part
    N = warp_sum(N);
    if (Lpart != nullptr) L = warp_sum(L);
  } else if (lanes == kWeightThreads) {
    N = block_sum(N, warp_sums);
    if (Lpart != nullptr) L = block_sum(L, warp_sums);
  }
  const bool mine = b < B && sub == 0;
  double w = 0.0;
  if (mine) {
    const double A = alpha_total(Apart, k, nblk_alpha);
    const double g = grad != nullptr ? static_cast<double>(grad[b * K + k]) : 1.0;
    w = g == 0.0 ? 0.0 : g * dpoch<double>(A, N) + (N == N ? 0.0 : NAN);  // zero_weight_rows
    if (Lpart != nullptr) out[b] = static_cast<scalar_t>(finish_row(L, N, 0.0, A, normalize));
  }
  w = block_sum(w, warp_sums);
  if (threadIdx.x == 0) Wpart[static_cast<int64_t>(k) * gridDim.x + blockIdx.x] = w;
}

// (At tall, 262 row tiles, this kernel takes ~9 us: 33 tiles per warp. 512
// or 1024 threads made ptxas spill; not pursued.)
constexpr int kFinishThreads = 256;
constexpr int kFinishWarps = kFinishThreads / 32;

// Columns per column_finish_kernel block: a thread per column when there are
// few row tiles, else 32 columns whose tiles the warps split.
__host__ __device__ inline int64_t finish_columns_per_block(int64_t row_tiles) {
  return row_tiles < 8 ? kFinishThreads : 32;
}

// grid (ceil(V / finish_columns_per_block), K): grad[k, v] = sum_tiles
// Cpart[tile, k, v] - a_kv S_k, S_k the ordered sum of Wpart[k, 0 ..
// wblocks) (NaN when a concentration of component k is not finite). With
// 32 columns per block, lane l owns column 32 blockIdx.x + l, warp w sums
// tiles w, w + kFinishWarps, ..., and the warp sums are added in order.
template <typename scalar_t>
__global__ void __launch_bounds__(kFinishThreads)
    column_finish_kernel(const double* __restrict__ Cpart, const double* __restrict__ Wpart,
                         int64_t wblocks, const double* __restrict__ Apart, int nblk_alpha,
                         const ColumnAlpha<scalar_t>* __restrict__ cols, int64_t V, int K,
                         int64_t row_tiles, scalar_t* __restrict__ grad_la) {
  const int k = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ double sums[kFinishWarps][32];
  __shared__ double S_k;
  if (warp == 0) {
    const double S = warp_ordered_sum(Wpart + static_cast<int64_t>(k) * wblocks, wblocks, 1);
    const double A = alpha_total(Apart, k, nblk_alpha);
    if (lane == 0) S_k = A == A ? S : NAN;
  }
  const int64_t per_block = finish_columns_per_block(row_tiles);
  if (per_block == kFinishThreads) {
    const int64_t v = static_cast<int64_t>(blockIdx.x) * kFinishThreads + threadIdx.x;
    double total = 0.0;
    if (v < V) {
      for (int64_t tile = 0; tile < row_tiles; ++tile) total += Cpart[(tile * K + k) * V + v];
    }
    __syncthreads();
    if (v < V) {
      grad_la[k * V + v] =
          static_cast<scalar_t>(total - static_cast<double>(cols[k * V + v].a) * S_k);
    }
    return;
  }
  const int64_t v = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  double c = 0.0;
  if (v < V) {
#pragma unroll 4
    for (int64_t tile = warp; tile < row_tiles; tile += kFinishWarps) {
      c += Cpart[(tile * K + k) * V + v];
    }
  }
  sums[warp][lane] = c;
  __syncthreads();
  if (warp == 0 && v < V) {
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < kFinishWarps; ++i) total += sums[i][lane];
    grad_la[k * V + v] = static_cast<scalar_t>(total - static_cast<double>(cols[k * V + v].a) * S_k);
  }
}

// Bytes of scratch memory for launch_column_finish's row-weight partials.
inline int64_t weight_partial_bytes(int64_t B, int K, int64_t parts) {
  return row_weights_blocks(B, parts) * K * static_cast<int64_t>(sizeof(double));
}

// Where launch_column_finish also writes the rows' log-likelihoods
// (log_lik_with_grad): the rows' lnpoch partials, laid out as Npart.
template <typename scalar_t>
struct RowOutputs {
  const double* Lpart = nullptr;
  bool normalize = false;
  scalar_t* out = nullptr;
};

// grad_la = column partials - a S from the row totals N (Npart: parts per
// row) and the column partials Cpart of row_tiles tiles; g null: unit row
// weights. Wpart: weight_partial_bytes of scratch memory.
template <typename scalar_t>
void launch_column_finish(const scalar_t* g, const double* Npart, int64_t parts,
                          const double* Cpart, int64_t row_tiles, const PreparedAlpha<scalar_t>& pa,
                          int64_t B, int64_t V, int K, double* Wpart, scalar_t* grad_la,
                          cudaStream_t stream, RowOutputs<scalar_t> rows = {}) {
  const int64_t wblocks = row_weights_blocks(B, parts);
  row_weights_kernel<scalar_t><<<dim3(static_cast<unsigned>(wblocks), static_cast<unsigned>(K)),
                                 kWeightThreads, 0, stream>>>(g, Npart, parts, pa.Apart, pa.nblk,
                                                              B, K, Wpart, rows.Lpart,
                                                              rows.normalize, rows.out);
  DM_CUDA_CHECK_LAUNCH();
  const dim3 fgrid(static_cast<unsigned>(ceil_div(V, finish_columns_per_block(row_tiles))),
                   static_cast<unsigned>(K));
  column_finish_kernel<scalar_t><<<fgrid, kFinishThreads, 0, stream>>>(
      Cpart, Wpart, wblocks, pa.Apart, pa.nblk, pa.cols, V, K, row_tiles, grad_la);
  DM_CUDA_CHECK_LAUNCH();
}

// Row quantities for the elementwise gradients:
//   d   = dpoch(A_b, N_b)                                   (per-sample grad_la)
//   psi = -digamma(N_b + A_b) [+ digamma(N_b + 1)]          (grad_counts)
struct RowTotals {
  double d, psi;
};

// A row's RowTotals from its N and A; a bad count (row_ok false) makes them NaN.
__device__ __forceinline__ RowTotals row_totals(double N, double A, bool row_ok, bool normalize) {
  if (!row_ok) N = NAN;
  double psi = -digamma<double>(N + A);
  if (normalize) psi += digamma<double>(N + 1.0);
  return {dpoch<double>(A, N) + (N == N ? 0.0 : NAN), psi};
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
    if (!per_sample) A = alpha_total(Apart, 0, nblk_alpha);
    totals[b] = row_totals(N, A, row_ok, normalize);
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
      grad_la[i] = static_cast<scalar_t>(
          g * (static_cast<double>(adpoch(a, n)) - static_cast<double>(a) * r.d));
    }
    if (grad_counts != nullptr) {
      double e = static_cast<double>(digamma<scalar_t>(n + a));
      if (normalize) e -= static_cast<double>(digamma<scalar_t>(n + scalar_t(1)));
      grad_counts[i] = static_cast<scalar_t>(g * (e + r.psi));
    }
  }
}


}  // namespace cuda
}  // namespace dirmult
