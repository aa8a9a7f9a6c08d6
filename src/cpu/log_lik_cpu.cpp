// CPU kernels for dirmult::log_lik and dirmult::log_lik_backward.
//
// Rows are processed in parallel (torch::stable::parallel_for). Per row the
// count total N and the concentration total A are accumulated in double, so N
// stays exact for integer counts up to 2^53, and the row term lnpoch(A, N) is
// evaluated in double. Column reductions for the shared-alpha gradient use a
// fixed partition of rows that depends on the shape only, then sum the
// partials in order: results are bitwise reproducible for any thread count.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/count_dispatch.h"
#include "../common/safe_box.h"
#include "../common/tensor_checks.h"
#include "../common/with_grad.h"
#include "dirmult/math.h"
#include "per_sample_avx2.h"
#include "shared_rows_avx2.h"
#include "components_cpu.h"
#include "tpoch_terms_cpu.h"

namespace dirmult {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// log n! for n = 0 .. kMaxExactCount, log_factorial's values (its bits),
// computed once.
template <typename scalar_t>
const std::array<scalar_t, kTableWidth>& small_log_factorials() {
  static const std::array<scalar_t, kTableWidth> t = [] {
    std::array<scalar_t, kTableWidth> f{};
    for (int n = 0; n < kTableWidth; ++n) f[n] = log_factorial(static_cast<scalar_t>(n));
    return f;
  }();
  return t;
}
// Rows from which the shared-alpha lookup tables are built. A column's
// table (one run of running products: 16 logs) costs about what 4-6 rows of
// direct evaluations do (~20 ns per random count, its loop exit and zero
// test mispredicting). Measured on 2 cores, forward: 16x65536 11.1 -> 5.1
// ms, 16x4096 1.50 -> 0.36 ms, 6x65536 6.6 (direct) vs 4.4 (table), 4 rows
// of 262144 columns 12-14 (direct) vs 15-18 (table). (32 before: from when
// each entry was a whole evaluation.)
constexpr int64_t kTableMinRows = 6;

// Whether the rows take a table, and up to which entry per column.
struct TablePlan {
  bool build = true;
  std::vector<uint8_t> tops;  // the last entry each column needs; empty: all
};

// An array of n values left uninitialized (a std::vector zeroes its
// elements first: SharedAlpha's 5 MB at 262144 columns took ~0.2 ms).
template <typename T>
class UninitArray {
 public:
  explicit UninitArray(int64_t n) : p_(new T[n]) {}
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  T& operator[](int64_t i) { return p_[i]; }
  const T& operator[](int64_t i) const { return p_[i]; }

 private:
  std::unique_ptr<T[]> p_;
};

// Columns per block of A's partial sums: fixed, so that A is the same bits
// for any thread count.
constexpr int64_t kAlphaSumBlock = 4096;

// Per-column state for a shared concentration vector.
template <typename scalar_t>
struct SharedAlpha {
  int64_t V;
  const scalar_t* log_alpha;  // the op's input (alive for the call)
  UninitArray<scalar_t> alpha;
  UninitArray<ExactFactors<scalar_t>> factors;
  double total = 0.0;  // A
  bool finite = true;

  SharedAlpha(const scalar_t* la, int64_t V_) : V(V_), log_alpha(la), alpha(V_), factors(V_) {
    // Blocks of kAlphaSumBlock columns in parallel: their exps and
    // divisions (1 / a for every column, so that exact_factors does not
    // branch), then their part of A in four interleaved sums over the
    // columns in order; the parts are added in order after. (One chain of
    // four sums over all the columns, after the exps, took ~0.16 ms at
    // 262144 columns. With the arrays left uninitialized and the math
    // path's skip of eight zeros, 2 cores, forward, ms, min of 25 calls,
    // three rounds: 1x262144 of zeros 0.83-1.16 -> 0.44-0.52, one dense row
    // 2.28-2.74 -> 1.72-2.15, eager 1.74-2.92.)
    const int64_t blocks = (V + kAlphaSumBlock - 1) / kAlphaSumBlock;
    std::vector<double> part(blocks);
    std::vector<char> part_finite(blocks);
    torch::stable::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t v0 = b * kAlphaSumBlock, v1 = std::min(V, v0 + kAlphaSumBlock);
        fill_columns(v0, v1);
        double s[4] = {0.0, 0.0, 0.0, 0.0};
        bool fin = true;
        int64_t v = v0;
        for (; v + 4 <= v1; v += 4) {
          for (int j = 0; j < 4; ++j) {
            s[j] += static_cast<double>(alpha[v + j]);
            fin = fin && is_finite(la[v + j]);
          }
        }
        for (; v < v1; ++v) {
          s[0] += static_cast<double>(alpha[v]);
          fin = fin && is_finite(la[v]);
        }
        part[b] = (s[0] + s[1]) + (s[2] + s[3]);
        part_finite[b] = fin;
      }
    });
    for (int64_t b = 0; b < blocks; ++b) {
      total += part[b];
      finite = finite && part_finite[b];
    }
  }

  // alpha and factors of columns [v0, v1).
  void fill_columns(int64_t v0, int64_t v1) {
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (cpu::shared_rows_avx2_available()) {  // (the same bits, eight at a time)
        cpu::shared_alpha_avx2(log_alpha + v0, v1 - v0, alpha.data() + v0, factors.data() + v0);
        return;
      }
    }
    for (int64_t v = v0; v < v1; ++v) {
      alpha[v] = dm_exp(log_alpha[v]);
      factors[v] = exact_factors(alpha[v], scalar_t(1) / alpha[v]);
    }
  }

  // (V, kTableWidth) exact-path values of the small integer counts, when
  // there are enough rows to reuse them (empty otherwise): lnpoch (minus
  // log n! when normalize) if log_poch, else alpha dpoch. A column's entries
  // come from one run of running products (math.h, exact_run_step: the
  // multiplications of lnpoch_exact, adpoch_exact and log n!, so their
  // values), not from an evaluation per entry.
  // plan (plan_table): whether to build it, and the last entry each column
  // needs (the entries above it are left 0 and never read). Float32 with
  // AVX2: eight columns at a time (table8; host_log_normal's bits in AVX2
  // lanes, so the same entries). 2 cores, counts 0..9, ms, the scalar and
  // vector builds alternating, five rounds on a noisy host, median (range):
  // forward 64x262144 45.1 (33-47) -> 29.7 (28-38), 32x262144 28.2 (22-30)
  // -> 19.8 (18-24), 16x65536 5.2 (3.9-5.3) -> 3.2 (3.0-4.2);
  // forward+backward 64x65536 22.4 (21-23) -> 19.9 (19-21), 16x65536 10.4
  // (8.2-13) -> 9.0 (7.2-9.9).
  std::vector<scalar_t> table(const TablePlan& plan, bool log_poch, bool normalize) const {
    if (!plan.build) return {};
    const std::vector<uint8_t>& tops = plan.tops;
    std::vector<scalar_t> t(V * kTableWidth);
    // log n! from a table, not a log of run.fact per entry: log_factorial's
    // value is the log of the same products, so the entries are the same bits.
    static const std::array<scalar_t, kTableWidth> kNoLogFact{};
    const std::array<scalar_t, kTableWidth>& log_fact =
        log_poch && normalize ? small_log_factorials<scalar_t>() : kNoLogFact;
    torch::stable::parallel_for(0, V, 64, [&](int64_t v0, int64_t v1) {
      int64_t v = v0;
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (cpu::shared_rows_avx2_available()) v = table8(tops, log_poch, log_fact, v0, v1, t);
      }
      for (; v < v1; ++v) {
        scalar_t* entry = t.data() + v * kTableWidth;
        ExactRun<scalar_t> run;  // after factors 1 .. n - 1 for entry n
        entry[0] = scalar_t(0);
        const int top = tops.empty() ? kMaxExactCount : tops[v];
        for (int n = 1; n <= top; ++n) {
          entry[n] = exact_run_value(run, factors[v], alpha[v], log_alpha[v], n, log_poch,
                                     false) -
                     log_fact[n];
          exact_run_step(factors[v], n, run);
        }
      }
    });
    return t;
  }

  // table()'s columns v0, v0 + 8, ... eight at a time (shared_table8_avx2,
  // the same entries; the cancelling ones redone here, as exact_run_value
  // does); returns the first column it left.
  int64_t table8(const std::vector<uint8_t>& tops, bool log_poch,
                 const std::array<float, kTableWidth>& log_fact, int64_t v0, int64_t v1,
                 std::vector<float>& t) const {
    int64_t v = v0;
    for (; v + 8 <= v1; v += 8) {
      int top = kMaxExactCount;
      if (!tops.empty()) top = *std::max_element(tops.begin() + v, tops.begin() + v + 8);
      float entry[kTableWidth][8];
      uint8_t redo[kTableWidth];
      cpu::shared_table8_avx2(alpha.data() + v, log_alpha + v, top, log_poch,
                              log_fact.data(), entry, redo);
      for (int j = 0; j < 8; ++j) {
        float* column = t.data() + (v + j) * kTableWidth;
        const int column_top = tops.empty() ? kMaxExactCount : tops[v + j];
        column[0] = 0.0f;
        for (int n = 1; n <= column_top; ++n) {
          column[n] = (redo[n] >> j & 1)
                          ? static_cast<float>(lnpoch_exact_refined(
                                static_cast<double>(log_alpha[v + j]), n)) -
                                log_fact[n]
                          : entry[n][j];
        }
      }
    }
    return v;
  }
};

// Whether n is an integer in [0, kMaxExactCount] (then idx = n). The range
// comes first: converting a float outside int's range is undefined, and a
// negative idx would read before the table (a count of -2^31 crashed).
template <typename scalar_t>
inline bool table_index(scalar_t n, int& idx) {
  if (!(n >= scalar_t(0) && n <= scalar_t(kMaxExactCount))) return false;  // NaN too
  idx = static_cast<int>(n);
  return static_cast<scalar_t>(idx) == n;
}

// The per-row part that does not depend on the columns:
// -lnpoch(A, N) [+ log N! when normalized].
inline double row_term(double A, double N, bool normalize) {
  double t = -lnpoch<double>(A, std::log(A), N);
  if (normalize) t += log_factorial<double>(N);
  return t;
}

// A row's column sums over a range of its columns.
struct RowSums {
  double s = 0.0, N = 0.0, A = 0.0;
  bool ok = true;
};

// Columns per work item when rows are few: with fewer rows than
// kRowsForRowsOnly, each row is split into chunks of kColumnChunk columns
// (items run in parallel; a row's chunks are then added in order), so that
// a few long rows still use every thread. The split depends on the shape
// only: results are the same bits for any thread count.
constexpr int64_t kRowsForRowsOnly = 64;
constexpr int64_t kColumnChunk = 16384;

// out[b] = finish(sum of part(b, v0, v1) over the row's chunks).
template <typename Part, typename Finish>
void for_each_row(int64_t B, int64_t V, Part part, Finish finish) {
  const int64_t chunks = B < kRowsForRowsOnly ? std::max<int64_t>(1, (V + kColumnChunk - 1) / kColumnChunk) : 1;
  if (chunks == 1) {
    torch::stable::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) finish(b, part(b, 0, V));
    });
    return;
  }
  std::vector<RowSums> sums(B * chunks);
  torch::stable::parallel_for(0, B * chunks, 1, [&](int64_t i0, int64_t i1) {
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

// Adds count c of column v to a row's sums by the math path; a bad count
// only clears ok (its terms are not evaluated).
template <typename scalar_t, typename count_t>
inline void add_math_term(RowSums& r, const SharedAlpha<scalar_t>& sa, int64_t v, count_t c,
                          bool normalize) {
  const scalar_t n = static_cast<scalar_t>(c);
  if (n == scalar_t(0)) return;
  if (!is_valid_count(n)) {
    r.ok = false;
    return;
  }
  r.N += static_cast<double>(c);
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

// Whether the shared-alpha math path takes eight counts at a time
// (lnp_row_sums with shared_lnpoch8_avx2).
template <typename scalar_t>
bool vector_math_path() {
  return std::is_same_v<scalar_t, float> && cpu::shared_rows_avx2_available();
}

// Rows below which a table is built only up to each column's largest count
// (plan_table): from about this many rows most columns hold their largest
// possible count, and the pass over the counts would cost more than the
// entries it saves.
constexpr int64_t kTopsMaxRows = 64;

// No table for fewer than kTableMinRows rows. From kTopsMaxRows rows, every
// entry. In between, one pass over the counts finds each column's largest
// count, capped at kMaxExactCount (a non-integer count rounds down: only
// more entries; NaN and negative counts ask for none), and the nonzero
// counts; the table is built when its entries plus its columns are at most
// 1.5 times the nonzero counts, which the math path would take one by one
// (2 cores, forward, ms, math path vs table at that ratio: 8x65536 at 10%
// nonzero 2.3 vs 5.4 at 4.4; counts 0..9 6x65536 6.3 vs 7.0 at 1.67,
// 8x262144 28.8 vs 23.2 at 1.29, 16x65536 14.0 vs 7.7 at 0.68; 1.2 to 1.5
// is a tie within 15%). Entries are the same bits however many are built,
// and the math path's values, so that a row's value does not depend on the
// other rows: bitwise in float32 without normalize; normalized (an entry is
// lnpoch - log n! rounded once) or in float64 (the paths sum a row in
// different orders), within a few roundings of its terms.
// vector_math: the rows' math path is shared_lnpoch8_avx2's (float32 with
// AVX2), ~4x faster per count: the table then only where its entries plus
// columns are at most the nonzero counts (fifteenth session, 2 cores,
// forward, ms, math path vs table: 8x262144 dense 13.9 vs 18.0 at 1.37,
// 8x65536 at log_alpha ~ U(0, 3) 2.9 vs 6.1, 16x65536 dense 6.5 vs 4.4 at
// 0.69, 32x65536 12.8 vs 5.9, 16x65536 at 10% nonzero 4.6 vs 7.0).
template <typename count_t>
TablePlan plan_table(const count_t* counts, int64_t B, int64_t V, bool vector_math) {
  if (B < kTableMinRows) return {false, {}};
  if (B >= kTopsMaxRows) return {true, {}};
  TablePlan plan;
  plan.tops.resize(V);
  constexpr int64_t kGrain = 4096;
  const int64_t chunks = (V + kGrain - 1) / kGrain;
  std::vector<int64_t> nonzero(chunks, 0), entries(chunks, 0);
  torch::stable::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t v0 = c * kGrain, v1 = std::min(V, v0 + kGrain);
      std::vector<float> top(v1 - v0, 0.0f);
      int64_t nz = 0;
      for (int64_t b = 0; b < B; ++b) {
        const count_t* row = counts + b * V;
        for (int64_t v = v0; v < v1; ++v) {
          const float x = static_cast<float>(row[v]);
          top[v - v0] = x > top[v - v0] ? x : top[v - v0];  // (NaN: false)
          nz += x != 0.0f;
        }
      }
      int64_t e = 0;
      for (int64_t v = v0; v < v1; ++v) {
        plan.tops[v] =
            static_cast<uint8_t>(std::min(top[v - v0], static_cast<float>(kMaxExactCount)));
        e += plan.tops[v];
      }
      nonzero[c] = nz, entries[c] = e;
    }
  });
  int64_t nz = 0, e = 0;
  for (int64_t c = 0; c < chunks; ++c) nz += nonzero[c], e += entries[c];
  plan.build = vector_math ? e + V <= nz : 2 * (e + V) <= 3 * nz;
  return plan;
}

// The lnpoch table of shared alpha (log n! subtracted when normalized) as
// planned (plan_table), or none.
template <typename scalar_t>
std::vector<scalar_t> lnp_table(const SharedAlpha<scalar_t>& sa, const TablePlan& plan,
                                bool normalize) {
  return sa.table(plan, true, normalize);
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
// double adds per row bounded the loop) and an integer count total; the
// others take the math path in column order into sums added last. The
// forward and the CPU single pass both sum rows here: the same bits.
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
          // Eight zeros add nothing (as below; their lanes' work and sixteen
          // adds of +0 took one row of 262144 zeros ~0.17 ms).
          if (all_zeros<8>(row + v)) continue;
          const float* n = counts_as_float(row, v, 8, nbuf);
          unsigned nonzero, done;
          cpu::shared_lnpoch8_avx2(sa.alpha.data() + v, sa.log_alpha + v, n, term,
                                   nonzero, done);
          // Lane j's term as add_math_term adds it (its count is 0..16).
          auto add_done = [&](int j) {
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
  auto add = [&](int64_t v, double& sum) {
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

// One row piece of the per-sample float32 forward, eight counts at a time
// (per_sample_avx2.h); the counts it leaves (off the table or bad) take the
// scalar path's steps here. The cancelling terms keep their float32 values
// where the error bound of those kept stays within 2^-22 of the row piece's
// magnitudes so far (the measure the row's accuracy is stated in,
// tests/reference.py magnitudes), else they are redone in float64 (as the
// scalar path does each): redoing all of them was most of the time at
// log_alpha < 0 (BENCHMARKS.md, CPU, twelfth session; the CUDA kernel
// decides the same way, forward_per_sample_float_kernel).
template <typename count_t>
RowSums per_sample_sums_avx2(const count_t* row, const float* lrow, int64_t v0, int64_t v1,
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
void per_sample_grad_avx2(const count_t* row, const float* lrow, int64_t V, double g, double d,
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

// The forward's plan for shared alpha (it depends on the counts only).
template <typename scalar_t, typename count_t>
TablePlan forward_plan(const count_t* counts, int64_t B, int64_t V) {
  return plan_table(counts, B, V, vector_math_path<scalar_t>());
}

// Shared alpha: out[b * stride] for each row b, with the table as planned.
template <typename scalar_t, typename count_t>
void forward_shared(const count_t* counts, const scalar_t* la, int64_t B, int64_t V,
                    bool normalize, const TablePlan& plan, scalar_t* out, int64_t stride) {
  const SharedAlpha<scalar_t> sa(la, V);
  const std::vector<scalar_t> table = lnp_table(sa, plan, normalize);
  auto part = [&](int64_t b, int64_t v0, int64_t v1) {
    return lnp_row_sums<scalar_t, count_t>(counts + b * V, v0, v1, table, sa, normalize);
  };
  for_each_row(B, V, part, [&](int64_t b, const RowSums& r) {
    const bool ok = r.ok && sa.finite;
    out[b * stride] = static_cast<scalar_t>(ok ? r.s + row_term(sa.total, r.N, normalize) : kNaN);
  });
}

template <typename scalar_t, typename count_t>
void forward_rows(const count_t* counts, const scalar_t* la, bool shared,
                  int64_t B, int64_t V, bool normalize, scalar_t* out) {
  if (shared) {
    forward_shared<scalar_t, count_t>(counts, la, B, V, normalize,
                                      forward_plan<scalar_t, count_t>(counts, B, V), out, 1);
    return;
  }
  auto part = [&](int64_t b, int64_t v0, int64_t v1) {
    const count_t* row = counts + b * V;
    const scalar_t* lrow = la + b * V;
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (cpu::per_sample_avx2_available()) {
        return per_sample_sums_avx2<count_t>(row, lrow, v0, v1, normalize);
      }
    }
    RowSums r;
    for (int64_t v = v0; v < v1; ++v) {
      const scalar_t a = dm_exp(lrow[v]);
      r.ok = r.ok && is_finite(lrow[v]);
      r.A += static_cast<double>(a);
      const scalar_t n = static_cast<scalar_t>(row[v]);
      if (n == scalar_t(0)) continue;
      if (!is_valid_count(n)) {  // the row is NaN; no term for it
        r.ok = false;
        continue;
      }
      r.N += static_cast<double>(row[v]);
      r.s += lnpoch(a, lrow[v], n);
      if (normalize) r.s -= log_factorial(n);
    }
    return r;
  };
  for_each_row(B, V, part, [&](int64_t b, const RowSums& r) {
    out[b] = static_cast<scalar_t>(r.ok ? r.s + row_term(r.A, r.N, normalize) : kNaN);
  });
}

// A row's count total over columns [v0, v1) and, for per-sample alpha, its
// concentration total; ok is false for a bad count or concentration.
template <typename scalar_t, typename count_t>
RowSums row_count_sums(const count_t* counts, const scalar_t* la, bool shared, int64_t b,
                       int64_t V, int64_t v0, int64_t v1) {
  const count_t* row = counts + b * V;
  RowSums r;
  // Four partial sums and the validity as a plain AND: one ordered chain of
  // dependent double adds was a third of the per-sample float32 backward's
  // time (BENCHMARKS.md, CPU, twelfth session). The same N for integer
  // counts (exact in double below 2^53); for fractional ones within a
  // rounding or so of the ordered sum.
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  bool ok = true;
  int64_t c = v0;
  for (; c + 4 <= v1; c += 4) {
    for (int j = 0; j < 4; ++j) {
      ok &= is_valid_count(static_cast<scalar_t>(row[c + j]));
      s[j] += static_cast<double>(row[c + j]);
    }
  }
  for (; c < v1; ++c) {
    ok &= is_valid_count(static_cast<scalar_t>(row[c]));
    s[0] += static_cast<double>(row[c]);
  }
  r.N = (s[0] + s[1]) + (s[2] + s[3]);
  r.ok = ok;
  if (shared) return r;
  const scalar_t* lrow = la + b * V;
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (cpu::per_sample_avx2_available()) {
      r.A = cpu::per_sample_alpha_sum_avx2(lrow + v0, v1 - v0, r.ok);
      return r;
    }
  }
  for (int64_t v = v0; v < v1; ++v) {
    r.ok = r.ok && is_finite(lrow[v]);
    r.A += static_cast<double>(dm_exp(lrow[v]));
  }
  return r;
}

// Row totals N_b and A_b (A_b = A for shared alpha); NaN N_b marks a bad row.
template <typename scalar_t, typename count_t>
void row_totals(const count_t* counts, const scalar_t* la, bool shared,
                int64_t b, int64_t V, double shared_A, double& N, double& A) {
  const RowSums r = row_count_sums<scalar_t, count_t>(counts, la, shared, b, V, 0, V);
  N = r.ok ? r.N : kNaN;
  A = shared ? shared_A : r.A;
}

// Shared alpha: grad_la[v] = sum_b g_b adpoch(a_v, n_bv) - a_v S,
// S = sum_b g_b dpoch(A, N_b). Rows with g_b = 0 are skipped, bad counts and
// all (zero_weight_rows in src/cuda/backward_kernels.cuh).
// backward_shared for a few long rows: the row totals by column chunks,
// then the columns in parallel chunks, each summing its rows in order (the
// same order, so the same bits, as one block of rows in backward_shared).
// vector_math: no table (term() is the math path), so the counts 1..16 may
// take shared_adpoch8_avx2.
template <typename scalar_t, typename count_t, typename Term>
void backward_shared_few_rows(const scalar_t* grad, const count_t* counts,
                              const SharedAlpha<scalar_t>& sa, int64_t B, int64_t V, Term term,
                              bool vector_math, scalar_t* grad_la) {
  std::vector<double> N(B);
  for_each_row(
      B, V,
      [&](int64_t b, int64_t v0, int64_t v1) {
        return row_count_sums<scalar_t, count_t>(counts, nullptr, true, b, V, v0, v1);
      },
      [&](int64_t b, const RowSums& r) { N[b] = r.ok ? r.N : kNaN; });
  double S = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    const double g = static_cast<double>(grad[b]);
    if (g != 0.0) S += N[b] == N[b] ? g * dpoch<double>(sa.total, N[b]) : kNaN;
  }
  if (!sa.finite) S = kNaN;
  torch::stable::parallel_for(0, V, kColumnChunk / 4, [&](int64_t v0, int64_t v1) {
    int64_t v = v0;
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (vector_math && vector_math_path<scalar_t>()) {
        // Eight columns at a time, each row's terms from shared_adpoch8_avx2
        // (the scalar path's bits) or term(), every column summing its rows
        // in order as below: the same bits.
        float nbuf[8], tv[8];
        for (; v + 8 <= v1; v += 8) {
          double c[8] = {};
          for (int64_t b = 0; b < B; ++b) {
            const count_t* row = counts + b * V;
            if (grad[b] == scalar_t(0) || all_zeros<8>(row + v)) continue;
            const float* n = counts_as_float(row, v, 8, nbuf);
            unsigned nonzero, done;
            cpu::shared_adpoch8_avx2(sa.alpha.data() + v, n, tv, nonzero, done);
            const double g = static_cast<double>(grad[b]);
            for (; nonzero != 0; nonzero &= nonzero - 1) {
              const int j = __builtin_ctz(nonzero);
              if (done >> j & 1) {
                c[j] += g * static_cast<double>(tv[j]);
                continue;
              }
              const scalar_t x = static_cast<scalar_t>(row[v + j]);
              if (x == scalar_t(0) || !is_valid_count(x)) continue;
              c[j] += g * static_cast<double>(term(v + j, x));
            }
          }
          for (int j = 0; j < 8; ++j) {
            grad_la[v + j] = static_cast<scalar_t>(c[j] - static_cast<double>(sa.alpha[v + j]) * S);
          }
        }
      }
    }
    for (; v < v1; ++v) {
      double c = 0.0;
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t n = static_cast<scalar_t>(counts[b * V + v]);
        // (A bad count's row has N[b] NaN: S and so the gradient are NaN.)
        if (n == scalar_t(0) || grad[b] == scalar_t(0) || !is_valid_count(n)) continue;
        c += static_cast<double>(grad[b]) * static_cast<double>(term(v, n));
      }
      grad_la[v] = static_cast<scalar_t>(c - static_cast<double>(sa.alpha[v]) * S);
    }
  });
}

// Adds g adpoch(a_v, n_v) to c[v] for one row's counts (shared alpha) and
// returns the row's count total, NaN for a bad count (whose term is not
// evaluated). With the adpoch table: counts on it add their entry without a
// branch (a zero adds g * 0, nothing), sixteen zeros in a row are skipped by
// one test (as lnp_row_sums); the others take the math path.
template <typename scalar_t, typename count_t>
double add_row_gradient(const count_t* row, int64_t V, double g,
                        const std::vector<scalar_t>& table, const SharedAlpha<scalar_t>& sa,
                        double* c) {
  double rare_N = 0.0;
  int64_t table_N = 0;
  bool ok = true;
  auto rare = [&](int64_t v) {
    const scalar_t n = static_cast<scalar_t>(row[v]);
    if (n == scalar_t(0)) return;
    if (!is_valid_count(n)) {
      ok = false;
      return;
    }
    rare_N += static_cast<double>(row[v]);
    c[v] += g * static_cast<double>(adpoch(sa.factors[v], sa.alpha[v], n));
  };
  if (table.empty()) {
    int64_t v = 0;
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (vector_math_path<scalar_t>()) {
        // Eight columns at a time (shared_adpoch8_avx2: the scalar path's
        // bits), the counts it leaves by rare(), in column order.
        float nbuf[8], term[8];
        for (; v + 8 <= V; v += 8) {
          if (all_zeros<8>(row + v)) continue;
          unsigned nonzero, done;
          cpu::shared_adpoch8_avx2(sa.alpha.data() + v, counts_as_float(row, v, 8, nbuf), term,
                                   nonzero, done);
          for (; nonzero != 0; nonzero &= nonzero - 1) {
            const int j = __builtin_ctz(nonzero);
            if (done >> j & 1) {
              rare_N += static_cast<double>(row[v + j]);
              c[v + j] += g * static_cast<double>(term[j]);
            } else {
              rare(v + j);
            }
          }
        }
      }
    }
    for (; v < V; ++v) rare(v);
    return ok ? rare_N : kNaN;
  }
  const scalar_t* t = table.data();
  auto add = [&](int64_t v) {
    const scalar_t n = static_cast<scalar_t>(row[v]);
    int idx;
    if (table_index(n, idx)) {
      c[v] += g * static_cast<double>(t[v * kTableWidth + idx]);
      table_N += idx;
    } else {
      rare(v);
    }
  };
  // The same walk as lnp_row_sums's, written again: a shared visitor
  // (lambdas through a helper) made both loops ~50% slower (GCC codegen).
  int64_t v = 0;
  for (; v + 16 <= V; v += 16) {
    if (all_zeros<16>(row + v)) continue;
    for (int i = 0; i < 16; ++i) add(v + i);
  }
  for (; v < V; ++v) add(v);
  return ok ? static_cast<double>(table_N) + rare_N : kNaN;
}

// Where backward_shared also writes the rows' log-likelihoods
// (log_lik_with_grad: unit row weights, one read of the counts).
template <typename scalar_t>
struct RowOutputs {
  bool normalize = false;
  scalar_t* out = nullptr;
};

// grad null: unit row weights. kRows: also the rows' log-likelihoods into
// rows.out, from a second table (lnpoch) read in the same pass.
// The backward's plan (it depends on the counts only). (With kRows the rows
// must be the forward's bits: its plan.)
template <typename scalar_t, typename count_t, bool kRows = false>
TablePlan backward_plan(const count_t* counts, int64_t B, int64_t V) {
  return plan_table(counts, B, V, kRows && vector_math_path<scalar_t>());
}

// plan: backward_plan's, or nullptr to make it here.
template <typename scalar_t, typename count_t, bool kRows = false>
void backward_shared(const scalar_t* grad, const count_t* counts,
                     const scalar_t* la, int64_t B, int64_t V,
                     scalar_t* grad_la, RowOutputs<scalar_t> rows = {},
                     const TablePlan* given_plan = nullptr) {
  const SharedAlpha<scalar_t> sa(la, V);
  const TablePlan own_plan =
      given_plan != nullptr ? TablePlan{} : backward_plan<scalar_t, count_t, kRows>(counts, B, V);
  const TablePlan& plan = given_plan != nullptr ? *given_plan : own_plan;
  const std::vector<scalar_t> table = sa.table(plan, false, false);
  auto term = [&](int64_t v, scalar_t n) {
    int idx;
    return !table.empty() && table_index(n, idx) ? table[v * kTableWidth + idx]
                                                 : adpoch(sa.factors[v], sa.alpha[v], n);
  };
  std::vector<scalar_t> lnp;
  if constexpr (kRows) lnp = lnp_table(sa, plan, rows.normalize);
  if (!kRows && B < kRowsForRowsOnly && V > kColumnChunk) {
    backward_shared_few_rows<scalar_t, count_t>(grad, counts, sa, B, V, term, table.empty(),
                                                grad_la);
    return;
  }
  // Fixed partition of rows into blocks; depends on (B, V) only.
  const int64_t max_blocks = std::max<int64_t>(1, (int64_t{1} << 23) / std::max<int64_t>(V, 1));
  const int64_t nblk = std::max<int64_t>(1, std::min<int64_t>({(B + 255) / 256, 64, max_blocks}));
  const int64_t rows_per = (B + nblk - 1) / nblk;
  std::vector<double> col(nblk * V, 0.0), s_part(nblk, 0.0);
  torch::stable::parallel_for(0, nblk, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      double* c = col.data() + k * V;
      double s = 0.0;
      for (int64_t b = k * rows_per; b < std::min(B, (k + 1) * rows_per); ++b) {
        const count_t* row = counts + b * V;
        const double g = grad != nullptr ? static_cast<double>(grad[b]) : 1.0;
        if (g == 0.0) continue;  // zero_weight_rows (src/cuda/backward_kernels.cuh)
        const double N = add_row_gradient<scalar_t, count_t>(row, V, g, table, sa, c);
        s += N == N ? g * dpoch<double>(sa.total, N) : kNaN;
        if constexpr (kRows) {
          // The row's log-likelihood summed as forward_rows sums it (the
          // same bits), in a second pass over the row, from the cache.
          const RowSums r = lnp_row_sums<scalar_t, count_t>(row, 0, V, lnp, sa, rows.normalize);
          rows.out[b] = static_cast<scalar_t>(
              r.ok && sa.finite ? r.s + row_term(sa.total, r.N, rows.normalize) : kNaN);
        }
      }
      s_part[k] = s;
    }
  });
  double S = 0.0;
  for (int64_t k = 0; k < nblk; ++k) S += s_part[k];
  if (!sa.finite) S = kNaN;
  for (int64_t v = 0; v < V; ++v) {
    double c = 0.0;
    for (int64_t k = 0; k < nblk; ++k) c += col[k * V + v];
    grad_la[v] = static_cast<scalar_t>(c - static_cast<double>(sa.alpha[v]) * S);
  }
}

// Elementwise gradients that need the row totals first: per-sample
// grad_log_alpha and/or grad_counts.
template <typename scalar_t, typename count_t>
void backward_rows(const scalar_t* grad, const count_t* counts,
                   const scalar_t* la, bool shared, int64_t B, int64_t V,
                   bool normalize, scalar_t* grad_la, scalar_t* grad_counts) {
  const double shared_A = shared ? SharedAlpha<scalar_t>(la, V).total : 0.0;
  torch::stable::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double N, A;
      row_totals<scalar_t, count_t>(counts, la, shared, b, V, shared_A, N, A);
      const double g = static_cast<double>(grad[b]);
      const scalar_t* lrow = shared ? la : la + b * V;
      const count_t* row = counts + b * V;
      if (grad_la != nullptr) {
        const double d = dpoch<double>(A, N);
        // (A bad count makes N, d and the row's gradient NaN.)
        auto scalar_term = [&](int64_t v) {
          const scalar_t a = dm_exp(lrow[v]);
          const scalar_t n = static_cast<scalar_t>(row[v]);
          const double t = is_valid_count(n) ? static_cast<double>(adpoch(a, n)) : kNaN;
          grad_la[b * V + v] = static_cast<scalar_t>(g * (t - static_cast<double>(a) * d));
        };
        bool done = false;
        if constexpr (std::is_same_v<scalar_t, float>) {
          if (!shared && cpu::per_sample_avx2_available()) {
            per_sample_grad_avx2<count_t>(row, lrow, V, g, d, grad_la + b * V, scalar_term);
            done = true;
          }
        }
        if (!done) {
          for (int64_t v = 0; v < V; ++v) scalar_term(v);
        }
      }
      if (grad_counts != nullptr) {
        double row_d = -digamma<double>(N + A);
        if (normalize) row_d += digamma<double>(N + 1.0);
        for (int64_t v = 0; v < V; ++v) {
          const scalar_t a = dm_exp(lrow[v]);
          const scalar_t n = static_cast<scalar_t>(row[v]);
          double e = static_cast<double>(digamma<scalar_t>(n + a));
          if (normalize) e -= static_cast<double>(digamma<scalar_t>(n + scalar_t(1)));
          grad_counts[b * V + v] = static_cast<scalar_t>(g * (e + row_d));
        }
      }
    }
  });
}

Tensor log_lik_cpu(Tensor counts, Tensor log_alpha, bool normalize) {
  const bool shared = check_log_alpha(counts, log_alpha);
  counts = as_contiguous(counts);
  log_alpha = as_contiguous(log_alpha);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  // V = 0: every row is empty, log-likelihood 0 (B counts no such rows).
  if (B == 0) return torch::stable::new_zeros(log_alpha, batch_shape(counts));
  Tensor out = torch::stable::new_empty(log_alpha, batch_shape(counts));  // every row written
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      forward_rows<scalar_t, count_t>(
          static_cast<const count_t*>(counts.const_data_ptr()),
          static_cast<const scalar_t*>(log_alpha.const_data_ptr()), shared, B,
          V, normalize, static_cast<scalar_t*>(out.mutable_data_ptr()));
    });
  });
  return out;
}

std::tuple<Tensor, Tensor> log_lik_backward_cpu(Tensor grad, Tensor counts,
                                                Tensor log_alpha,
                                                bool normalize,
                                                bool counts_grad) {
  const bool shared = check_log_lik_backward(grad, counts, log_alpha);
  counts = as_contiguous(counts);
  log_alpha = as_contiguous(log_alpha);
  grad = as_contiguous(grad);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  Tensor grad_la = torch::stable::new_zeros(log_alpha, log_alpha.sizes());
  Tensor grad_counts =
      torch::stable::new_zeros(log_alpha, counts_grad_shape(counts, counts_grad));
  if (B == 0 || V == 0) return {grad_la, grad_counts};
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      const auto* g = static_cast<const scalar_t*>(grad.const_data_ptr());
      const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
      const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
      auto* gla = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
      auto* gc = counts_grad ? static_cast<scalar_t*>(grad_counts.mutable_data_ptr()) : nullptr;
      if (shared) backward_shared<scalar_t, count_t>(g, n, la, B, V, gla);
      if (!shared || gc != nullptr) {
        backward_rows<scalar_t, count_t>(g, n, la, shared, B, V, normalize,
                                         shared ? nullptr : gla, gc);
      }
    });
  });
  return {grad_la, grad_counts};
}

// One pass (backward_shared with the rows' log-likelihoods) where the rows
// are processed whole; a few long rows, split into column chunks by the
// forward and the backward, take the two of them.
std::tuple<Tensor, Tensor> log_lik_with_grad_cpu(Tensor counts, Tensor log_alpha,
                                                 bool normalize) {
  check_log_lik_with_grad(counts, log_alpha);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  if (B == 0 || (B < kRowsForRowsOnly && V > kColumnChunk)) {
    return log_lik_with_grad_from_ops(log_lik_cpu, log_lik_backward_cpu, counts, log_alpha,
                                      normalize);
  }
  counts = as_contiguous(counts);
  log_alpha = as_contiguous(log_alpha);
  Tensor out = torch::stable::new_empty(log_alpha, batch_shape(counts));  // every row written
  Tensor grad_la = torch::stable::new_empty(log_alpha, log_alpha.sizes());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      backward_shared<scalar_t, count_t, true>(
          nullptr, static_cast<const count_t*>(counts.const_data_ptr()),
          static_cast<const scalar_t*>(log_alpha.const_data_ptr()), B, V,
          static_cast<scalar_t*>(grad_la.mutable_data_ptr()),
          {normalize, static_cast<scalar_t*>(out.mutable_data_ptr())});
    });
  });
  return {out, grad_la};
}

std::tuple<Tensor, Tensor> poch_terms_cpu(Tensor log_alpha, Tensor n) {
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()) &&
                      n.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: poch_terms takes float32/float64 log_alpha and n of one dtype");
  STD_TORCH_CHECK(log_alpha.numel() == n.numel(),
                  "dirmult: poch_terms needs log_alpha and n of one size");
  log_alpha = as_contiguous(log_alpha);
  n = as_contiguous(n);
  Tensor lnp = torch::stable::empty_like(log_alpha);
  Tensor adp = torch::stable::empty_like(log_alpha);
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
    const auto* x = static_cast<const scalar_t*>(n.const_data_ptr());
    auto* o1 = static_cast<scalar_t*>(lnp.mutable_data_ptr());
    auto* o2 = static_cast<scalar_t*>(adp.mutable_data_ptr());
    for (int64_t i = 0; i < log_alpha.numel(); ++i) {
      const scalar_t a = dm_exp(la[i]);
      o1[i] = lnpoch(a, la[i], x[i]);
      o2[i] = adpoch(a, x[i]);
    }
  });
  return {lnp, adp};
}

}  // namespace

void components_forward_cpu(const Tensor& counts, const Tensor& log_alpha, bool normalize,
                            Tensor& out) {
  const int64_t B = counts.size(0), V = counts.size(1), K = log_alpha.size(0);
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
      const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
      auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
      const TablePlan plan = forward_plan<scalar_t, count_t>(n, B, V);  // (once for all K)
      for (int64_t k = 0; k < K; ++k) {
        forward_shared<scalar_t, count_t>(n, la + k * V, B, V, normalize, plan, o + k, K);
      }
    });
  });
}

void components_backward_cpu(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                             Tensor& grad_la) {
  const int64_t B = counts.size(0), V = counts.size(1), K = log_alpha.size(0);
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      const auto* g = static_cast<const scalar_t*>(grad.const_data_ptr());
      const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
      const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
      auto* gla = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
      const TablePlan plan = backward_plan<scalar_t, count_t>(n, B, V);  // (once for all K)
      std::vector<scalar_t> gk(B);  // component k's row weights, contiguous
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t b = 0; b < B; ++b) gk[b] = g[b * K + k];
        backward_shared<scalar_t, count_t>(gk.data(), n, la + k * V, B, V, gla + k * V, {},
                                           &plan);
      }
    });
  });
}

// Defined in components_cpu.cpp.
Tensor log_lik_components_cpu(Tensor counts, Tensor log_alpha, bool normalize);
Tensor log_lik_components_backward_cpu(Tensor grad, Tensor counts, Tensor log_alpha);
// Defined in log_lik_csr_cpu.cpp.
Tensor log_lik_csr_cpu(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize);
Tensor log_lik_csr_backward_cpu(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                Tensor csc_row, Tensor csc_val, Tensor log_alpha);

}  // namespace dirmult

STABLE_TORCH_LIBRARY_IMPL(dirmult, CPU, m) {
  m.impl("log_lik", DM_BOX(&dirmult::log_lik_cpu));
  m.impl("log_lik_backward", DM_BOX(&dirmult::log_lik_backward_cpu));
  m.impl("log_lik_components", DM_BOX(&dirmult::log_lik_components_cpu));
  m.impl("log_lik_components_backward",
         DM_BOX(&dirmult::log_lik_components_backward_cpu));
  m.impl("log_lik_with_grad", DM_BOX(&dirmult::log_lik_with_grad_cpu));
  m.impl("poch_terms", DM_BOX(&dirmult::poch_terms_cpu));
  m.impl("tpoch_terms", DM_BOX(&dirmult::tpoch_terms_cpu));
  m.impl("log_lik_csr", DM_BOX(&dirmult::log_lik_csr_cpu));
  m.impl("log_lik_csr_backward", DM_BOX(&dirmult::log_lik_csr_backward_cpu));
}
