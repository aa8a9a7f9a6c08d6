// The fused regression kernels' shared steps (See Note [Regression fusion]):
// a block's tile of W in shared memory, a batch of rows' covariates and
// counts, and the batch's log concentrations X[b] W + bias in registers.
// A thread owns kCols consecutive columns of the tile; the tile is
// blockDim.x * kCols columns, tile blockIdx.y of the row.
#pragma once

#include <cstdint>

namespace dirmult {
namespace cuda {

// kCols consecutive values, for one vector load where aligned.
template <typename T, int kCols>
struct alignas(kCols * sizeof(T)) ColVec {
  T v[kCols];
};

// The thread's first column, and whether each of its columns is in the row.
template <int kCols>
struct ThreadCols {
  int64_t first;
  bool in[kCols];
};

template <int kCols>
__device__ __forceinline__ ThreadCols<kCols> thread_cols(int64_t V) {
  ThreadCols<kCols> t;
  t.first = static_cast<int64_t>(blockIdx.y) * blockDim.x * kCols + threadIdx.x * kCols;
#pragma unroll
  for (int j = 0; j < kCols; ++j) t.in[j] = t.first + j < V;
  return t;
}

// W_s[p * tile + c] = W[p, tile_begin + c] for p < kMaxP, zero past P and V
// (the padded rows and columns add nothing). Then the caller's barrier.
template <typename scalar_t, int kCols, int kMaxP>
__device__ __forceinline__ void stage_w_tile(const scalar_t* __restrict__ W, int P, int64_t V,
                                             scalar_t* __restrict__ W_s) {
  const int tile = blockDim.x * kCols;
  const int64_t v0 = static_cast<int64_t>(blockIdx.y) * tile;
  for (int i = threadIdx.x; i < kMaxP * tile; i += blockDim.x) {
    const int p = i / tile;
    const int64_t v = v0 + (i - p * tile);
    W_s[i] = p < P && v < V ? W[p * V + v] : scalar_t(0);
  }
}

// The batch's covariates, transposed: X_s[p * kRows + r] = X[b0 + r, p],
// zero for rows at or past row_end and for p >= P. Coalesced reads (p
// fastest). Between the caller's barriers.
template <typename scalar_t, int kMaxP, int kRows>
__device__ __forceinline__ void stage_x_batch(const scalar_t* __restrict__ X, int P, int64_t b0,
                                              int64_t row_end, scalar_t* __restrict__ X_s) {
  for (int i = threadIdx.x; i < kRows * kMaxP; i += blockDim.x) {
    const int r = i / kMaxP, p = i - r * kMaxP;
    const int64_t b = b0 + r;
    X_s[p * kRows + r] = b < row_end && p < P ? X[b * P + p] : scalar_t(0);
  }
}

// The thread's counts of row `row` (nullptr: past the rows), zero past V;
// one vector load where aligned (V % kCols == 0 and the counts aligned to
// kCols counts).
template <typename count_t, int kCols>
__device__ __forceinline__ void load_thread_counts(const count_t* __restrict__ row,
                                                   const ThreadCols<kCols>& cols, bool aligned,
                                                   count_t (&c)[kCols]) {
  if (row != nullptr && aligned && cols.in[kCols - 1]) {
    const ColVec<count_t, kCols> x = *reinterpret_cast<const ColVec<count_t, kCols>*>(row + cols.first);
#pragma unroll
    for (int j = 0; j < kCols; ++j) c[j] = x.v[j];
    return;
  }
#pragma unroll
  for (int j = 0; j < kCols; ++j) {
    c[j] = row != nullptr && cols.in[j] ? row[cols.first + j] : count_t(0);
  }
}

// la[r][j] = bias_j + sum_{p < P} X[b0 + r, p] W[p, column j], p in order:
// a vector load of the thread's W values per p serves every row of the
// batch, one broadcast read of X_s per row and p.
template <typename scalar_t, int kCols, int kMaxP, int kRows>
__device__ __forceinline__ void batch_log_alpha(const scalar_t* __restrict__ W_s,
                                                const scalar_t* __restrict__ X_s, int P,
                                                const scalar_t (&bias)[kCols],
                                                scalar_t (&la)[kRows][kCols]) {
  const int tile = blockDim.x * kCols;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) la[r][j] = bias[j];
  }
#pragma unroll
  for (int p = 0; p < kMaxP; ++p) {
    if (p >= P) break;
    const ColVec<scalar_t, kCols> w =
        *reinterpret_cast<const ColVec<scalar_t, kCols>*>(W_s + p * tile + threadIdx.x * kCols);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const scalar_t x = X_s[p * kRows + r];
#pragma unroll
      for (int j = 0; j < kCols; ++j) la[r][j] = fma(x, w.v[j], la[r][j]);
    }
  }
}

// One count's log concentration again, for a term taken after the batch's
// rows (off the exact path): row r of the batch, column c of the tile, the
// same operations in the same order as batch_log_alpha, so the same bits.
template <typename scalar_t, int kCols, int kRows>
__device__ __forceinline__ scalar_t log_alpha_at(const scalar_t* __restrict__ W_s,
                                                 const scalar_t* __restrict__ X_s, int P,
                                                 scalar_t bias, int r, int c) {
  const int tile = blockDim.x * kCols;
  scalar_t la = bias;
#pragma unroll 1
  for (int p = 0; p < P; ++p) la = fma(X_s[p * kRows + r], W_s[p * tile + c], la);
  return la;
}

}  // namespace cuda
}  // namespace dirmult
