// The row kernels' work items: rows split into chunks of columns, a warp
// per (row, chunk), and the chunk partials that finish_rows_kernel sums in a
// fixed order (See Note [Determinism]).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ceil_div.cuh"
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

// The per-row terms that do not depend on the columns, from log A (See Note
// [Log-space totals]). log A is NaN when a concentration is not finite:
// every row is NaN then, empty rows too (for which lnpoch(A, 0) would be 0).
__device__ __forceinline__ double finish_row(double s, double N, double norm, double log_A,
                                             bool normalize) {
  if (log_A != log_A) return log_A;
  double out = s - lnpoch<double>(exp(log_A), log_A, N);
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

// Lane 0's result for (row, chunk, component k of K) of shared alpha: the
// finished value when the row is one chunk (log_A: the component's log
// total), else the chunk's partial for finish_rows_kernel.
template <typename scalar_t>
__device__ __forceinline__ void write_row_result(const RowItem& it, const RowSplit& split, int K,
                                                 int k, double s, double N, double norm,
                                                 double log_A, bool normalize,
                                                 scalar_t* __restrict__ out,
                                                 RowPartial* __restrict__ partial) {
  if (split.num_chunks == 1) {
    out[it.b * K + k] = static_cast<scalar_t>(finish_row(s, N, norm, log_A, normalize));
  } else {
    partial[(it.b * split.num_chunks + it.c) * K + k] = {s, N, norm, 0.0};
  }
}

}  // namespace cuda
}  // namespace dirmult
