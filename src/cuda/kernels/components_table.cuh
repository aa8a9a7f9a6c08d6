// Lookup-table kernels for K mixture components (log_lik_components and its
// backward), float32 concentrations.
//
// The shared-alpha tables carry over (See Note [Tables]): with (K, V)
// concentrations fixed for the call, the terms of a small integer count n
// take kTableWidth values per (component, column). A block owns a slice of
// C columns for KB components and stages that slice of the tables in shared
// memory (C * KB * kTableWidth floats, the same 136 KiB for every KB), so
// every count is read once per block of KB components and costs KB shared-
// memory lookups instead of KB products and logs.
//
// Shared-memory layout [n][k][pos(v)]: the lanes of a warp read KB entries of
// the same n-row at consecutive positions, so no lookup has a bank conflict
// whatever the counts are.
#pragma once

#include "alpha_prep.cuh"
#include "row_chunks.cuh"
#include "table_layout.cuh"
#include "table_lookup.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

constexpr int kCompThreads = 512;
constexpr int kCompWarps = kCompThreads / 32;
constexpr int kCompTableFloats = 128 * 16 * kTableWidth;
constexpr size_t kCompTableBytes = kCompTableFloats * sizeof(float);

// Columns per block for KB components.
template <int KB>
struct CompSlice {
  static constexpr int kCols = kCompTableFloats / (KB * kTableWidth);
  static_assert(kCols % 128 == 0, "a slice is whole warps of 4-count loads");
};

// Stages the (K * V, kTableWidth) global table's slice: columns [v0, v0 +
// len) of components [kb, kb + KB). Missing components read as 0.
// kPermute: position of column v is (v % 4) * (C / 4) + v / 4, which makes
// the lanes of a 4-counts-per-lane load hit consecutive banks.
template <int KB, bool kPermute>
__device__ __forceinline__ void stage_component_tables(float* __restrict__ tab,
                                                       const float* __restrict__ table, int64_t V,
                                                       int K, int kb, int64_t v0, int len) {
  constexpr int C = CompSlice<KB>::kCols;
  const int per_k = len * kTableWidth;
  for (int i = threadIdx.x; i < KB * per_k; i += blockDim.x) {
    const int k = i / per_k, r = i - k * per_k;
    const int v = r / kTableWidth, n = r - v * kTableWidth;
    const int pos = kPermute ? (v & 3) * (C / 4) + (v >> 2) : v;
    tab[(n * KB + k) * C + pos] =
        kb + k < K ? table[((kb + k) * V + v0 + v) * kTableWidth + n] : 0.0f;
  }
  __syncthreads();
}

// Forward. grid (column slices, row groups, ceil(K / KB)); a warp per row.
// Spart (B, slices, K): each (row, slice, component) sum of lnpoch terms.
// Npart (B, slices): {N, -sum log n! of the counts off the table}, written by
// the blocks of the first component block; N is NaN for a bad count.
template <typename count_t, int KB>
__global__ void __launch_bounds__(kCompThreads, 1)
    components_table_forward_kernel(const count_t* __restrict__ counts,
                                    const float* __restrict__ table,
                                    const ColumnAlpha<float>* __restrict__ cols, int64_t B,
                                    int64_t V, int K, int64_t rows_per_group, bool aligned,
                                    bool normalize, float* __restrict__ Spart,
                                    double2* __restrict__ Npart) {
  constexpr int C = CompSlice<KB>::kCols;
  constexpr int L = C / 128;                // 16-byte loads per lane per row
  constexpr int RU = L >= 4 ? 1 : 4 / L;    // rows loaded together: 4 loads in flight
  extern __shared__ float tab[];
  const int64_t slice = blockIdx.x, num_slices = gridDim.x;
  const int64_t v0 = slice * C;
  const int len = static_cast<int>(min(V - v0, static_cast<int64_t>(C)));
  const int kb = blockIdx.z * KB;
  stage_component_tables<KB, true>(tab, table, V, K, kb, v0, len);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t b_begin = blockIdx.y * rows_per_group;
  const int64_t b_end = min(B, b_begin + rows_per_group);
  for (int64_t b0 = b_begin + warp * RU; b0 < b_end; b0 += kCompWarps * RU) {
    float n[RU][L][4];
    double exact[RU][L][4];
#pragma unroll
    for (int r = 0; r < RU; ++r) {
#pragma unroll
      for (int u = 0; u < L; ++u) {
        const int64_t b = min(b0 + r, b_end - 1);  // past the end: a row read twice, unused
        load_counts<float, count_t>(counts + b * V + v0, 4 * lane + 128 * u, len, aligned,
                                    n[r][u], exact[r][u]);
      }
    }
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      const int64_t b = b0 + r;
      if (b >= b_end) break;  // warp-uniform
      float acc[KB];
#pragma unroll
      for (int k = 0; k < KB; ++k) acc[k] = 0.0f;
      double N = 0.0, norm = 0.0;
      bool ok = true;
      unsigned rare = 0;  // counts off the table, bit 4 u + j
#pragma unroll
      for (int u = 0; u < L; ++u) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float x = n[r][u][j];
          if (x == 0.0f) continue;
          ok = ok && is_valid_count(x);
          N += exact[r][u][j];
          int idx;
          if (table_index(x, idx)) {
            const float* t = tab + idx * (KB * C) + j * (C / 4) + 32 * u + lane;
#pragma unroll
            for (int k = 0; k < KB; ++k) acc[k] += t[k * C];
          } else if (is_valid_count(x)) {
            rare |= 1u << (4 * u + j);
          }
        }
      }
      float part = warp_reduce_scatter<KB>(acc, lane);
      // Non-integer or large counts: the math path, taken by the whole warp
      // for one such count at a time, a component per lane. After the
      // reduction, so that no per-component sums are live across its calls
      // (they were kept on the stack, and every lookup paid for it).
      unsigned pending = __ballot_sync(0xffffffffu, rare != 0);
#pragma unroll 1
      while (pending != 0) {
        const int src = __ffs(static_cast<int>(pending)) - 1;
        pending &= pending - 1;
        unsigned m = __shfl_sync(0xffffffffu, rare, src);
#pragma unroll 1
        while (m != 0) {
          const int e = __ffs(static_cast<int>(m)) - 1;
          m &= m - 1;
          const int64_t v = v0 + 4 * src + 128 * (e >> 2) + (e & 3);
          const float x = static_cast<float>(counts[b * V + v]);
          if (lane < KB && kb + lane < K) {
            const ColumnAlpha<float> col = cols[(kb + lane) * V + v];
            part += lnpoch(col.factors(), col.a, col.log_a, x);
          }
          if (normalize && lane == 0) norm -= static_cast<double>(log_factorial(x));
        }
      }
      const bool row_ok = __all_sync(0xffffffffu, ok);
      if (lane < KB && kb + lane < K) {
        Spart[(b * num_slices + slice) * K + kb + lane] = row_ok ? part : NAN;
      }
      if (blockIdx.z == 0) {
        N = warp_sum(N);
        if (__any_sync(0xffffffffu, norm != 0.0)) norm = warp_sum(norm);
        if (lane == 0) Npart[b * num_slices + slice] = make_double2(row_ok ? N : NAN, norm);
      }
    }
  }
}

// out[b, k] from the slice partials, summed in slice order; a thread each.
template <typename scalar_t>  // float: the table path is float32
__global__ void __launch_bounds__(256)
    components_finish_kernel(const scalar_t* __restrict__ Spart, const double2* __restrict__ Npart,
                             int64_t num_slices, const double* __restrict__ Apart, int nblk_alpha,
                             int64_t B, int K, bool normalize, scalar_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * K) return;
  const int64_t b = i / K;
  const int k = static_cast<int>(i - b * K);
  double s = 0.0, N = 0.0, norm = 0.0;
  for (int64_t sl = 0; sl < num_slices; ++sl) {
    s += static_cast<double>(Spart[(b * num_slices + sl) * K + k]);
    const double2 p = Npart[b * num_slices + sl];
    N += p.x;
    norm += p.y;
  }
  const double log_A = alpha_log_total<scalar_t>(Apart, k, nblk_alpha);
  out[i] = static_cast<scalar_t>(finish_row(s, N, norm, log_A, normalize));
}

// Backward, the table part of grad_la:
//   Cpart[tile, k, v] = sum_{b in tile} G[b, k] adpoch(a_kv, n_bv).
// grid (column slices, row tiles, ceil(K / KB)). Thread t owns column
// t % C and components 4 (t / C) .. + 3 of the block, with float64 sums in
// registers down the rows (no cross-thread reduction at all).
template <typename count_t, int KB>
__global__ void __launch_bounds__(kCompThreads, 1)
    components_table_backward_kernel(const float* __restrict__ grad,
                                     const count_t* __restrict__ counts,
                                     const ColumnAlpha<float>* __restrict__ cols,
                                     const float* __restrict__ table, int64_t B, int64_t V, int K,
                                     int64_t rows_per_tile, double* __restrict__ Cpart) {
  constexpr int C = CompSlice<KB>::kCols;
  static_assert(kCompThreads == C * (KB / 4), "a thread per (column, 4 components)");
  constexpr int kRows = 8;  // loads in flight per thread
  extern __shared__ float tab[];
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * C;
  const int len = static_cast<int>(min(V - v0, static_cast<int64_t>(C)));
  const int kb = blockIdx.z * KB;
  stage_component_tables<KB, false>(tab, table, V, K, kb, v0, len);

  const int c = threadIdx.x % C, q = threadIdx.x / C;
  const int kq = kb + 4 * q;
  const bool in = c < len;
  const int64_t v = v0 + c;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  const float* t_col = tab + (4 * q) * C + c;
  const int64_t b_begin = blockIdx.y * rows_per_tile;
  const int64_t b_end = min(B, b_begin + rows_per_tile);
  for (int64_t b0 = b_begin; b0 < b_end; b0 += kRows) {
    // The batch's counts and gradient rows first, so their loads overlap.
    float x[kRows], g[kRows][4];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool row_in = b0 + r < b_end;
      x[r] = in && row_in ? static_cast<float>(counts[(b0 + r) * V + v]) : 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        g[r][i] = row_in && kq + i < K ? grad[(b0 + r) * K + kq + i] : 0.0f;
      }
    }
    // The batch's terms are summed in float (at most kRows of them), then
    // added to the float64 sums.
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    unsigned rare = 0;  // rows whose count is off the table
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (x[r] == 0.0f) continue;
      int idx;
      if (table_index(x[r], idx)) {
        const float* t = t_col + idx * (KB * C);
#pragma unroll
        for (int i = 0; i < 4; ++i) part[i] = fmaf(g[r][i], t[i * C], part[i]);
      } else if (is_valid_count(x[r])) {
        rare |= 1u << r;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += static_cast<double>(part[i]);
    // Non-integer or large counts: one rolled copy of the math path (see the
    // forward kernel).
#pragma unroll 1
    while (rare != 0) {
      const int r = __ffs(static_cast<int>(rare)) - 1;
      rare &= rare - 1;
      const float xr = static_cast<float>(counts[(b0 + r) * V + v]);
#pragma unroll 1
      for (int i = 0; i < 4 && kq + i < K; ++i) {
        const ColumnAlpha<float> col = cols[(kq + i) * V + v];
        const double t = static_cast<double>(grad[(b0 + r) * K + kq + i]) *
                         static_cast<double>(adpoch(col.factors(), col.a, xr));
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) acc[ii] += ii == i ? t : 0.0;
      }
    }
  }
  if (!in) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (kq + i < K) Cpart[(blockIdx.y * static_cast<int64_t>(K) + kq + i) * V + v] = acc[i];
  }
}

// N[b] = sum_v counts[b, v] (NaN for a bad count); a warp per row.
template <typename count_t>
__global__ void __launch_bounds__(256)
    row_count_totals_kernel(const count_t* __restrict__ counts, int64_t B, int64_t V, bool aligned,
                            double* __restrict__ N) {
  const int lane = threadIdx.x & 31;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (b >= B) return;
  double s = 0.0;
  bool ok = true;
  for (int64_t v = 4 * lane; v < V; v += 128) {
    float n[4];
    double exact[4];
    load_counts<float, count_t>(counts + b * V, v, V, aligned, n, exact);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ok = ok && (n[j] == 0.0f || is_valid_count(n[j]));
      s += exact[j];
    }
  }
  s = warp_sum(s);
  const bool row_ok = __all_sync(0xffffffffu, ok);
  if (lane == 0) N[b] = row_ok ? s : NAN;
}

}  // namespace cuda
}  // namespace dirmult
