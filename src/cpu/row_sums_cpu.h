// A row's sums over its columns, the pieces that the forward, the single
// pass and the backward share: the row loop (for_each_row, which splits a
// few long rows into column chunks), the shared-alpha row sum of lnpoch terms
// (lnp_row_sums: from the table or the math path) and the row term.
//
// Per row the count total N and the concentration total A are accumulated
// in double, so N stays exact for integer counts up to 2^53, and the row
// term lnpoch(A, N) is evaluated in double.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dirmult/math.h"
#include "policy_cpu.h"
#include "shared_rows_avx2.h"
#include "tables_cpu.h"

namespace dirmult {
namespace cpu {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// DM_ALWAYS_INLINE: inlined at every call. The per-row and per-count steps
// of the row loops carry it: GCC's inliner otherwise stops at a limit on each
// file's growth, so that whether they are inlined, and the table path's
// speed, would depend on what else their file holds (docs/PERFORMANCE_LEDGER.md, CPU).
#if defined(__GNUC__) || defined(__clang__)
#define DM_ALWAYS_INLINE __attribute__((always_inline))
#else
#define DM_ALWAYS_INLINE
#endif

// The per-row part that does not depend on the columns:
// -lnpoch(A, N) [+ log N! when normalized].
DM_ALWAYS_INLINE inline double row_term(const LogTotal& A, double N, bool normalize) {
  double t = -lnpoch<double>(A.A, A.log_A, N);
  if (normalize) t += log_factorial<double>(N);
  return t;
}

// A row's total from its summed exps, with its log_alpha lrow (V,) for the
// log-space total where the sum is out of range.
template <typename scalar_t>
inline LogTotal row_log_total(double A, const scalar_t* lrow, int64_t V) {
  return make_log_total<scalar_t>(A, [&] { return log_sum_exp(lrow, V); });
}

// A row's column sums over a range of its columns.
struct RowSums {
  double s = 0.0, N = 0.0, A = 0.0;
  bool ok = true;
};

// out[b] = finish(sum of part(b, v0, v1) over the row's chunks): rows in
// parallel, or with few rows (row_chunks) chunks of kColumnChunk columns in
// parallel, a row's chunks then added in order (See Note [Determinism]).
template <typename Part, typename Finish>
void for_each_row(int64_t B, int64_t V, Part part, Finish finish) {
  const int64_t chunks = row_chunks(B, V);
  if (chunks == 1) {
    torch::stable::parallel_for(0, B, parallel_grain(V, 16), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) finish(b, part(b, 0, V));
    });
    return;
  }
  std::vector<RowSums> sums(B * chunks);
  const int64_t grain = parallel_grain(std::min(V, kColumnChunk));
  torch::stable::parallel_for(0, B * chunks, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / chunks, c = i % chunks;
      sums[i] = part(b, c * kColumnChunk, std::min(V, (c + 1) * kColumnChunk));
    }
  });
  for (int64_t b = 0; b < B; ++b) {
    RowSums total;
    for (int64_t c = 0; c < chunks; ++c) {
      const RowSums& r = sums[b * chunks + c];
      total.s += r.s, total.N += r.N, total.A += r.A, total.ok = total.ok && r.ok;
    }
    finish(b, total);
  }
}

// Whether integer count c is not a value of scalar_t (float32 above 2^24):
// its terms are then evaluated in float64, so that the count keeps its value.
template <typename scalar_t, typename count_t>
DM_ALWAYS_INLINE inline bool count_rounds(count_t c) {
  if constexpr (std::is_integral_v<count_t> && sizeof(count_t) >= 4 &&
                std::is_same_v<scalar_t, float>) {
    return static_cast<double>(static_cast<float>(c)) != static_cast<double>(c);
  } else {
    return false;
  }
}

// lnpoch(exp(la), c) [- log c!] in float64, for a count that count_rounds.
template <typename scalar_t, typename count_t>
inline double count_term_f64(scalar_t la, count_t c, bool normalize) {
  const double l = static_cast<double>(la), n = static_cast<double>(c);
  double t = lnpoch<double>(std::exp(l), l, n);
  if (normalize) t -= log_factorial<double>(n);
  return t;
}

// adpoch(exp(la), c) in float64, for a count that count_rounds.
template <typename scalar_t, typename count_t>
inline double count_adpoch_f64(scalar_t la, count_t c) {
  return adpoch<double>(std::exp(static_cast<double>(la)), static_cast<double>(c));
}

// Adds count c of column v to a row's sums by the math path; a bad count
// only clears ok (its terms are not evaluated).
template <typename scalar_t, typename count_t>
DM_ALWAYS_INLINE inline void add_math_term(RowSums& r, const SharedAlpha<scalar_t>& sa, int64_t v, count_t c,
                          bool normalize) {
  const scalar_t n = static_cast<scalar_t>(c);
  if (n == scalar_t(0)) return;
  if (!is_valid_count(n)) {
    r.ok = false;
    return;
  }
  r.N += static_cast<double>(c);
  if (count_rounds<scalar_t>(c)) {
    r.s += count_term_f64(sa.log_alpha[v], c, normalize);
    return;
  }
  r.s += lnpoch(sa.factors[v], sa.alpha[v], sa.log_alpha[v], n);
  if (normalize) r.s -= log_factorial(n);
}

// Whether the kN counts from p are all zero (+0 or -0), from their bits:
// one test for all, with no conversion.
template <int kN, typename count_t>
inline bool all_zeros(const count_t* p) {
  using U = std::conditional_t<
      sizeof(count_t) == 1, uint8_t,
      std::conditional_t<sizeof(count_t) == 2, uint16_t,
                         std::conditional_t<sizeof(count_t) == 4, uint32_t, uint64_t>>>;
  static_assert(sizeof(U) == sizeof(count_t), "a count is 1, 2, 4 or 8 bytes");
  U u[kN];
  std::memcpy(u, p, sizeof(u));
  U any = 0;
  for (int i = 0; i < kN; ++i) any = static_cast<U>(any | u[i]);
  // Floating types (float, double, Half, BFloat16): the sign bit aside.
  constexpr U kMagnitude = std::is_integral_v<count_t>
                               ? static_cast<U>(~U(0))
                               : static_cast<U>(~(U(1) << (8 * sizeof(U) - 1)));
  return (any & kMagnitude) == 0;
}

// Counts row[v .. v + m) as float for the AVX2 blocks: the row
// itself for float counts, else a copy in buf where the conversion is
// exact and NaN (left to the scalar path) where it is not.
template <typename count_t>
const float* counts_as_float(const count_t* row, int64_t v, int m, float* buf) {
  if constexpr (std::is_same_v<count_t, float>) {
    return row + v;
  } else {
    for (int i = 0; i < m; ++i) {
      const float f = static_cast<float>(row[v + i]);
      buf[i] = static_cast<double>(f) == static_cast<double>(row[v + i])
                   ? f
                   : std::numeric_limits<float>::quiet_NaN();
    }
    return buf;
  }
}

// A row's lnpoch sum, count total and validity over columns [v0, v1), shared
// alpha. With the table (lnp_table): counts that are integers in [0,
// kMaxExactCount] read it, zeros included (entry 0 is 0; sixteen zeros in a
// row are skipped), into four interleaved sums (one chain of dependent
// double adds would bound the loop) and an integer count total; the others
// take the math path in column order into sums added last. The forward and
// the single pass both sum rows here: the same bits (See Note [Single pass]).
template <typename scalar_t, typename count_t>
RowSums lnp_row_sums(const count_t* row, int64_t v0, int64_t v1,
                     const std::vector<scalar_t>& table, const SharedAlpha<scalar_t>& sa,
                     bool normalize) {
  RowSums rare;
  if (table.empty()) {
    int64_t v = v0;
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (vector_math_path<scalar_t>()) {
        // Eight columns at a time: the counts 1..16 that do not cancel from
        // the vector lanes (the scalar path's bits), the others by the
        // scalar path, all added in column order as below.
        const std::array<float, kTableWidth>& log_fact = small_log_factorials<float>();
        float nbuf[8], term[8];
        for (; v + 8 <= v1; v += 8) {
          // Eight zeros add nothing (as below): skip their lanes' work and
          // sixteen adds of +0.
          if (all_zeros<8>(row + v)) continue;
          const float* n = counts_as_float(row, v, 8, nbuf);
          unsigned nonzero, done;
          cpu::shared_lnpoch8_avx2(sa.alpha.data() + v, sa.log_alpha + v, n, term,
                                   nonzero, done);
          // Lane j's term as add_math_term adds it (its count is 0..16).
          auto add_done = [&](int j) DM_ALWAYS_INLINE {
            rare.N += static_cast<double>(row[v + j]);
            rare.s += static_cast<double>(term[j]);
            if (normalize) rare.s -= static_cast<double>(log_fact[static_cast<int>(n[j])]);
          };
          if (done == nonzero) {
            // Every count 0..16: no branch per lane. A zero count's term and
            // log 0! are 0 and add nothing (the sums start at +0), as
            // skipping it would.
            for (int j = 0; j < 8; ++j) add_done(j);
            continue;
          }
          for (; nonzero != 0; nonzero &= nonzero - 1) {
            const int j = __builtin_ctz(nonzero);
            if (done >> j & 1) {
              add_done(j);
            } else {
              add_math_term(rare, sa, v + j, row[v + j], normalize);
            }
          }
        }
      }
    }
    for (; v < v1; ++v) add_math_term(rare, sa, v, row[v], normalize);
    return rare;
  }
  const scalar_t* t = table.data();
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t table_N = 0;
  auto add = [&](int64_t v, double& sum) DM_ALWAYS_INLINE {
    const scalar_t n = static_cast<scalar_t>(row[v]);
    int idx;
    if (table_index(n, idx)) {
      sum += static_cast<double>(t[v * kTableWidth + idx]);
      table_N += idx;
    } else {
      add_math_term(rare, sa, v, row[v], normalize);
    }
  };
  int64_t v = v0;
  for (; v + 16 <= v1; v += 16) {
    // Sixteen zeros add nothing: one branch, taken nearly always in sparse
    // rows and nearly never in dense ones (so predicted either way); the
    // sixteen counts otherwise in four interleaved sums.
    if (all_zeros<16>(row + v)) continue;
    for (int i = 0; i < 16; i += 4) {
      add(v + i, s[0]);
      add(v + i + 1, s[1]);
      add(v + i + 2, s[2]);
      add(v + i + 3, s[3]);
    }
  }
  for (; v < v1; ++v) add(v, s[0]);
  RowSums r;
  r.s = ((s[0] + s[1]) + (s[2] + s[3])) + rare.s;
  r.N = static_cast<double>(table_N) + rare.N;
  r.ok = rare.ok;
  return r;
}

}  // namespace cpu
}  // namespace dirmult
