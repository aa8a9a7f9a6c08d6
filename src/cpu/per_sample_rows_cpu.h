// The per-sample float32 row functions with per_sample_avx2's blocks, shared
// by log_lik, log_lik_backward and log_lik_regression (which runs them on
// its blocks of log_alpha rows: See Note [Regression fusion]).
#pragma once

#include <algorithm>
#include <cstdint>

#include "dirmult/math.h"
#include "per_sample_avx2.h"
#include "row_sums_cpu.h"

namespace dirmult {
namespace cpu {

// One row piece of the per-sample float32 forward, eight counts at a time
// (per_sample_avx2.h); the counts it leaves (off the table or bad) take the
// scalar path's steps here. The cancelling terms keep their float32 values
// while the error bound of those kept stays within 2^-22 of the row piece's
// magnitudes so far (kKeptCancelErrorBudget), else they are redone in
// float64: See Note [Float64 redo].
template <typename count_t>
inline RowSums per_sample_sums_avx2(const count_t* row, const float* lrow, int64_t v0, int64_t v1,
                             bool normalize) {
  constexpr int kBlock = cpu::kPerSampleBlock;
  cpu::PerSampleBlockSums sums;
  RowSums r;
  float nbuf[kBlock];
  uint16_t rest[kBlock], cancelling[kBlock];
  float kept_err = 0.0f;
  for (int64_t v = v0; v < v1; v += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, v1 - v));
    const float* n = counts_as_float(row, v, m, nbuf);
    int cancels = 0;
    const int others =
        cpu::per_sample_block_avx2(lrow + v, n, m, normalize, sums, rest, cancelling, cancels);
    if (cancels != 0) {
      if (kept_err + sums.cancel_err <= kKeptCancelErrorBudget * sums.magnitude) {
        kept_err += sums.cancel_err;
        r.s += sums.cancel_s;
      } else {
        for (int j = 0; j < cancels; ++j) {  // the float64 value lnpoch takes after float32's
          const int64_t u = v + cancelling[j];
          r.s += static_cast<float>(
              lnpoch_exact_refined(static_cast<double>(lrow[u]), static_cast<int>(row[u])));
        }
      }
    }
    for (int j = 0; j < others; ++j) {  // as the scalar path (A is in sums)
      const int64_t u = v + rest[j];
      const float c = static_cast<float>(row[u]);
      if (!is_valid_count(c)) {
        r.ok = false;
        continue;
      }
      r.N += static_cast<double>(row[u]);
      if (count_rounds<float>(row[u])) {
        r.s += count_term_f64(lrow[u], row[u], normalize);
        continue;
      }
      r.s += lnpoch(dm_exp(lrow[u]), lrow[u], c);
      if (normalize) r.s -= log_factorial(c);
    }
  }
  r.s += sums.s - sums.norm;
  r.N += static_cast<double>(sums.N);
  r.A = sums.A;
  r.ok = r.ok && sums.finite;
  return r;
}

// One row's per-sample gradient with respect to log_alpha (out[0, V)),
// eight counts at a time; scalar_term(v) writes the elements the blocks
// leave (counts off the table or bad).
template <typename count_t, typename ScalarTerm>
inline void per_sample_grad_avx2(const count_t* row, const float* lrow, int64_t V, double g, double d,
                          float* out, ScalarTerm scalar_term) {
  constexpr int kBlock = cpu::kPerSampleBlock;
  float nbuf[kBlock];
  uint16_t rest[kBlock];
  for (int64_t v = 0; v < V; v += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, V - v));
    const float* n = counts_as_float(row, v, m, nbuf);
    const int others = cpu::per_sample_grad_block_avx2(lrow + v, n, m, g, d, out + v, rest);
    for (int j = 0; j < others; ++j) scalar_term(v + rest[j]);
  }
}

}  // namespace cpu
}  // namespace dirmult
