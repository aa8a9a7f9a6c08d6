// Counts off the tables (non-integer, large or bad): the math path, one
// rolled copy out of the hot loops, spread over the warp's lanes (See Note
// [Rare counts]).
#pragma once

#include "alpha_prep.cuh"
#include "spread_marks.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// The prepared columns of a chunk made where they are needed, from log_alpha
// (at the chunk's first column), for kernels that do not wait for
// alpha_prep_kernel's: the same bits (column_alpha).
struct ColumnsFromLogAlpha {
  const float* __restrict__ log_alpha;
  __device__ __forceinline__ ColumnAlpha<float> operator[](int v) const {
    return column_alpha(log_alpha[v]);
  }
};

// The math path's value of an off-table count: its term, the count (NaN
// for a bad count) and -log n!.
struct RareTerm {
  double lnpoch, n, norm;
};

// The RareTerm of count c; lnpoch_of(x) gives its term at x = float(c),
// called only for a valid count.
template <typename count_t, typename LnPoch>
__device__ __forceinline__ RareTerm rare_term(count_t c, bool normalize, LnPoch lnpoch_of) {
  const float x = static_cast<float>(c);
  if (!is_valid_count(x)) return RareTerm{0.0, NAN, 0.0};
  return RareTerm{static_cast<double>(lnpoch_of(x)), static_cast<double>(c),
                  normalize ? -static_cast<double>(log_factorial(x)) : 0.0};
}

__device__ __forceinline__ void add_rare_term(const RareTerm& t, bool normalize, double& s,
                                              double& rare_N, double& norm, bool& ok) {
  if (t.n != t.n) {  // a bad count
    ok = false;
    return;
  }
  rare_N += t.n;
  s += t.lnpoch;
  if (normalize) norm += t.norm;
}

// Non-integer, large or bad counts (add_table_terms's marks, the lane's
// columns base + 128 (e / 4) + e % 4 for bit e, base = 4 lane + a
// warp-uniform offset; row and cols at the chunk's first column: prepared
// columns, or ColumnsFromLogAlpha) take the math path, spread over the
// warp's lanes (spread_marks): one copy of it, out of the unrolled loop, so
// that the hot loop's code stays small (a copy per unrolled element
// overflowed the instruction cache). Warp-uniform call.
template <typename count_t, typename Columns>
__device__ __forceinline__ void add_rare_terms(unsigned rare, const count_t* __restrict__ row,
                                               int base, const Columns cols, bool normalize,
                                               double& s, double& rare_N, double& norm, bool& ok) {
  if (!__any_sync(0xffffffffu, rare != 0)) return;
  const int lane = threadIdx.x & 31;
  auto compute = [&](int owner, int e) {
    const int v = base + 4 * (owner - lane) + 128 * (e >> 2) + (e & 3);
    return rare_term(row[v], normalize, [&](float x) {
      const ColumnAlpha<float> col = cols[v];
      return lnpoch(col.factors(), col.a, col.log_a, x);
    });
  };
  auto consume = [&](int, const RareTerm& t) { add_rare_term(t, normalize, s, rare_N, norm, ok); };
  spread_marks<RareTerm>(rare, compute, consume);
}

}  // namespace cuda
}  // namespace dirmult
