// A shared concentration vector's per-column state (SharedAlpha) and its
// lookup tables of the small integer counts' exact-path values, with the
// plan of which tables to build (See Note [Tables]). Defined in
// tables_cpu.cpp for float and double and every count type.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "dirmult/math.h"
#include "policy_cpu.h"

namespace dirmult {
namespace cpu {

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

// Whether the rows take a table, and up to which entry per column.
struct TablePlan {
  bool build = true;
  std::vector<uint8_t> tops;  // the last entry each column needs; empty: all
};

// An array of n values left uninitialized (a std::vector zeroes its
// elements first, a measurable part of a wide row's time).
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

// Per-column state for a shared concentration vector: alpha = exp(log_alpha),
// the exact path's factors, and A with its finiteness, summed by blocks of
// kAlphaSumBlock columns (See Note [Determinism]).
template <typename scalar_t>
struct SharedAlpha {
  int64_t V;
  const scalar_t* log_alpha;  // the op's input (alive for the call)
  UninitArray<scalar_t> alpha;
  UninitArray<ExactFactors<scalar_t>> factors;
  double total = 0.0;  // A
  bool finite = true;
  LogTotal log_total{};  // A with log A (See math.h, LogTotal)

  SharedAlpha(const scalar_t* la, int64_t V_);

  // alpha and factors of columns [v0, v1).
  void fill_columns(int64_t v0, int64_t v1);

  // (V, kTableWidth) exact-path values of the small integer counts as
  // planned (plan_table; empty when not built): lnpoch (minus log n! when
  // normalize) if log_poch, else alpha dpoch. Entries above a column's top
  // are left 0 and never read.
  std::vector<scalar_t> table(const TablePlan& plan, bool log_poch, bool normalize) const;

  // table()'s columns v0, v0 + 8, ... eight at a time (float32 with AVX2);
  // returns the first column it left.
  int64_t table8(const std::vector<uint8_t>& tops, bool log_poch,
                 const std::array<float, kTableWidth>& log_fact, int64_t v0, int64_t v1,
                 std::vector<float>& t) const;
};

// Whether n is an integer in [0, kMaxExactCount] (then idx = n). The range
// comes first: converting a float outside int's range is undefined, and a
// negative idx would read before the table.
template <typename scalar_t>
inline bool table_index(scalar_t n, int& idx) {
  if (!(n >= scalar_t(0) && n <= scalar_t(kMaxExactCount))) return false;  // NaN too
  idx = static_cast<int>(n);
  return static_cast<scalar_t>(idx) == n;
}

// Which table B rows of counts (B, V) take: none below kTableMinRows rows,
// every entry from kTopsMaxRows, in between the entries up to each column's
// largest count where table_pays. vector_math: the rows' math path is the
// eight-lane one.
template <typename count_t>
TablePlan plan_table(const count_t* counts, int64_t B, int64_t V, bool vector_math);

// The forward's plan for shared alpha (it depends on the counts only).
template <typename scalar_t, typename count_t>
TablePlan forward_plan(const count_t* counts, int64_t B, int64_t V) {
  return plan_table(counts, B, V, vector_math_path<scalar_t>());
}

// The backward's plan (it depends on the counts only). With kRows the rows'
// log-likelihoods must be the forward's bits: its plan.
template <typename scalar_t, typename count_t, bool kRows = false>
TablePlan backward_plan(const count_t* counts, int64_t B, int64_t V) {
  return plan_table(counts, B, V, kRows && vector_math_path<scalar_t>());
}

// The lnpoch table of shared alpha (log n! subtracted when normalized) as
// planned, or none.
template <typename scalar_t>
std::vector<scalar_t> lnp_table(const SharedAlpha<scalar_t>& sa, const TablePlan& plan,
                                bool normalize) {
  return sa.table(plan, true, normalize);
}

}  // namespace cpu
}  // namespace dirmult
