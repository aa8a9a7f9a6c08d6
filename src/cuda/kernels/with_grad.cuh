// log_lik_with_grad: the rows' log-likelihoods and the gradient of their sum
// with respect to log_alpha, from one read of the counts (shared float32
// alpha, the table path).
//
// A training step reads the counts twice, once in the forward and once in
// the backward, and at the large shapes both kernels are bound by those
// reads. For a loss that sums the rows, every row's weight in the backward
// is the same number g, so the backward is g times the gradient of the sum,
// which this kernel computes during the forward (python/dirmult_ext/ops/dispatch.py
// tells a uniform g from the incoming gradient's strides):
//
//   with_grad_kernel: column_backward_kernel's structure (a block owns 1024
//   columns x a tile of rows, a thread keeps 4 columns' sums down the rows)
//   with unit row weights, plus each row's lnpoch sum from a second table.
//   Each warp writes its part of the row's lnpoch sum (Lpart) and count
//   (Npart) for 128 columns; launch_column_finish sums them per row (the
//   log-likelihoods) and finishes the gradient, in fixed orders.
#pragma once

#include "column_backward.cuh"
#include "dependent_launch.cuh"
#include "rare_counts.cuh"
#include "table_fill.cuh"
#include "table_layout.cuh"
#include "table_lookup.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// Shared memory: the block's slices of both tables.
constexpr size_t kWithGradSmemBytes = 2 * kTableSmemBytes;

// grid (col_chunks, row_tiles); kGroups x 256 threads: group g takes the
// tile's row batches g, g + kGroups, ... (more warps per SM: with two table
// slices only one block fits). Cpart: (row_tiles * kGroups, V).
// Npart, Lpart: (B, col_chunks, kColWarps). tables: the kBoth table.
// kFill (a grid of one row tile: each chunk's slices used once): the block
// fills both of its slices itself from log_alpha (fill_table_slice, the
// same entries as prep_and_table_kernel's) instead of staging them from
// the global table, which is then neither written nor read; launched as a
// dependent of alpha_prep_kernel (cols, read by the rare counts) and
// waiting for it after the fill.
template <typename count_t, int kGroups, bool kFill = false>
__global__ void __launch_bounds__(kColThreads * kGroups, 1)
    with_grad_kernel(const count_t* __restrict__ counts, const ColumnAlpha<float>* __restrict__ cols,
                     const float* __restrict__ lnp_table, const float* __restrict__ adp_table,
                     const float* __restrict__ log_alpha, int64_t B, int64_t V,
                     ColumnTiling tiling, bool aligned, bool normalize,
                     double* __restrict__ Cpart, double* __restrict__ Npart,
                     double* __restrict__ Lpart) {
  static_assert(kColsPerBlock == kTableChunk, "the table slot layout is per 1024 columns");
  const int t = threadIdx.x % kColThreads, group = threadIdx.x / kColThreads;
  const int lane = t & 31, warp = t >> 5;
  const int64_t v0 = blockIdx.x * static_cast<int64_t>(kColsPerBlock) + 4 * t;
  const int64_t b_begin = blockIdx.y * tiling.rows_per_tile;
  const int64_t b_end = min(B, b_begin + tiling.rows_per_tile);
  const int64_t n_parts = tiling.col_chunks * kColWarps;  // Npart / Lpart entries per row
  const int64_t part = blockIdx.x * kColWarps + warp;

  const count_t* base = counts + v0;
  const int64_t v_end = V - v0;  // columns left from v0
  extern __shared__ float tabs[];  // [lnpoch slice | alpha dpoch slice]
  if constexpr (kFill) {
    SliceAlpha<kColThreads * kGroups> alpha;
    alpha.load(log_alpha, V, blockIdx.x);
    fill_table_slice<kColThreads * kGroups, TableKind::kBoth>(tabs, alpha, V, blockIdx.x,
                                                               normalize);
    wait_for_prior_grid();
  } else {
    // Launched as a dependent of prep_and_table_kernel (launch_dependent):
    // its launch overlaps the tables' preparation.
    wait_for_prior_grid();
    stage_table_slice(tabs, lnp_table, blockIdx.x);  // columns past V: entry 0 (= 0)
    stage_table_slice(tabs + kChunkFloats, adp_table, blockIdx.x);
  }
  const float* lq = tabs + t;  // table_slot(4 t + j, n) = n * 1024 + j * 256 + t
  const float* aq = tabs + kChunkFloats + t;

  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t b0 = b_begin + group * kRowBatch; b0 < b_end; b0 += kGroups * kRowBatch) {
    float n[kRowBatch][4];
    double unused[kRowBatch][4];
    load_row_batch(base, V, b0, b_end, v_end, aligned, n, unused);
    // The branch-free lookups (see forward_table_kernel): a count off the
    // table looks up entry 0 and is marked rare (bit 4 i + j).
    unsigned rare = 0;
    double row_l[kRowBatch];  // this thread's part of each row's lnpoch sum
    int row_n[kRowBatch];     // and of its table counts
    float acc_batch[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      float l = 0.0f;  // 4 terms in float, then float64
      row_n[i] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int idx;
        const bool hit = table_index(n[i][j], idx);
        idx = hit ? idx : 0;
        row_n[i] += idx;
        rare |= hit ? 0u : 1u << (4 * i + j);
        l += lq[idx * kTableChunk + j * (kTableChunk / 4)];
        acc_batch[j] += aq[idx * kTableChunk + j * (kTableChunk / 4)];
      }
      row_l[i] = static_cast<double>(l);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] += static_cast<double>(acc_batch[j]);
    // Non-integer, large or bad counts: one rolled copy of the math path, out
    // of the unrolled loops. A bad count makes its row's sums NaN (and so the
    // gradient, through N).
    double rare_n[kRowBatch];
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) rare_n[i] = 0.0;
    const bool any_rare = __any_sync(0xffffffffu, rare != 0);
    if (any_rare) {  // spread over the warp's lanes (spread_marks)
      struct Term {
        double l, cnt, d;
      };
      auto compute = [&](int owner, int e) {
        const int64_t v = 4 * (owner - lane) + (e & 3);  // the owner's column, from v0
        double d = 0.0;
        const RareTerm r = rare_term(base[(b0 + (e >> 2)) * V + v], normalize, [&](float x) {
          const ColumnAlpha<float> cl = cols[v0 + v];
          d = static_cast<double>(adpoch(cl.factors(), cl.a, x));
          return lnpoch(cl.factors(), cl.a, cl.log_a, x);
        });
        // (A bad count: its n is NaN, and its l too.)
        return Term{r.n == r.n ? r.lnpoch + r.norm : NAN, r.n, d};
      };
      auto consume = [&](int e, const Term& r) {
        const int i = e >> 2, j = e & 3;
        // Constant indices only: the arrays stay in registers.
#pragma unroll
        for (int ii = 0; ii < kRowBatch; ++ii) {
          row_l[ii] += ii == i ? r.l : 0.0;
          rare_n[ii] += ii == i ? r.cnt : 0.0;
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) acc[jj] += jj == j ? r.d : 0.0;
      };
      spread_marks<Term>(rare, compute, consume);
    }
    // Lane l ends with the sums of the batch's row l % kRowBatch.
    const double L = warp_reduce_scatter<kRowBatch>(row_l, lane);
    double N = static_cast<double>(warp_reduce_scatter<kRowBatch>(row_n, lane));
    if (any_rare) N += warp_reduce_scatter<kRowBatch>(rare_n, lane);
    const int64_t b = b0 + lane;
    if (lane < kRowBatch && b < b_end) {
      Lpart[b * n_parts + part] = L;
      Npart[b * n_parts + part] = N;
    }
  }
  const int64_t tile = static_cast<int64_t>(blockIdx.y) * kGroups + group;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (v0 + j < V) Cpart[tile * V + v0 + j] = acc[j];
  }
}

}  // namespace cuda
}  // namespace dirmult
