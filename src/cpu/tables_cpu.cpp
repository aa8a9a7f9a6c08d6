// SharedAlpha and the lookup tables (See Note [Tables]): each column's
// entries come from one run of running products (math.h exact_run_step: the
// multiplications of lnpoch_exact, adpoch_exact and log n!, so their
// values), not from an evaluation per entry; float32 with AVX2 runs eight
// columns at a time (shared_table8_avx2: host_log_normal's bits in AVX2
// lanes, so the same entries). And the plan of which entries to build.
#include "tables_cpu.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../common/count_dispatch.h"
#include "dirmult/math.h"
#include "shared_rows_avx2.h"

namespace dirmult {
namespace cpu {

template <typename scalar_t>
SharedAlpha<scalar_t>::SharedAlpha(const scalar_t* la, int64_t V_)
    : V(V_), log_alpha(la), alpha(V_), factors(V_) {
  // Blocks of kAlphaSumBlock columns in parallel: their exps and divisions
  // (1 / a for every column, so that exact_factors does not branch), then
  // their part of A in four interleaved sums over the columns in order; the
  // parts are added in order after.
  const int64_t blocks = (V + kAlphaSumBlock - 1) / kAlphaSumBlock;
  std::vector<double> part(blocks);
  std::vector<char> part_finite(blocks);
  torch::stable::parallel_for(0, blocks, parallel_grain(kAlphaSumBlock), [&](int64_t b0, int64_t b1) {
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
  log_total = make_log_total<scalar_t>(total, [&] { return log_sum_exp(la, V); });
  total = log_total.A;
}

template <typename scalar_t>
void SharedAlpha<scalar_t>::fill_columns(int64_t v0, int64_t v1) {
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

template <typename scalar_t>
std::vector<scalar_t> SharedAlpha<scalar_t>::table(const TablePlan& plan, bool log_poch,
                                                   bool normalize) const {
  if (!plan.build) return {};
  const std::vector<uint8_t>& tops = plan.tops;
  std::vector<scalar_t> t(V * kTableWidth);
  // log n! from a table, not a log of run.fact per entry: log_factorial's
  // value is the log of the same products, so the entries are the same bits.
  static const std::array<scalar_t, kTableWidth> kNoLogFact{};
  const std::array<scalar_t, kTableWidth>& log_fact =
      log_poch && normalize ? small_log_factorials<scalar_t>() : kNoLogFact;
  torch::stable::parallel_for(0, V, parallel_grain(kTableWidth, 64), [&](int64_t v0, int64_t v1) {
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

// The entries that cancel are redone here, as exact_run_value does (See
// Note [Float64 redo]).
template <typename scalar_t>
int64_t SharedAlpha<scalar_t>::table8(const std::vector<uint8_t>& tops, bool log_poch,
                                      const std::array<float, kTableWidth>& log_fact,
                                      int64_t v0, int64_t v1, std::vector<float>& t) const {
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

// In between kTableMinRows and kTopsMaxRows rows, one pass over the counts
// finds each column's largest count, capped at kMaxExactCount (a non-integer
// count rounds down: only more entries; NaN and negative counts ask for
// none), and the nonzero counts, which the math path would take one by one.
// Entries are the same bits however many are built, and the math path's
// values, so that a row's value does not depend on the other rows (See Note
// [Batch invariance]).
template <typename count_t>
TablePlan plan_table(const count_t* counts, int64_t B, int64_t V, bool vector_math) {
  if (B < kTableMinRows) return {false, {}};
  if (B >= kTopsMaxRows) return {true, {}};
  TablePlan plan;
  plan.tops.resize(V);
  constexpr int64_t kGrain = 4096;
  const int64_t chunks = (V + kGrain - 1) / kGrain;
  std::vector<int64_t> nonzero(chunks, 0), entries(chunks, 0);
  torch::stable::parallel_for(0, chunks, parallel_grain(kGrain * B), [&](int64_t c0, int64_t c1) {
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
  plan.build = table_pays(e, V, nz, vector_math);
  return plan;
}

template struct SharedAlpha<float>;
// (table8 is float32's only.)
template SharedAlpha<double>::SharedAlpha(const double*, int64_t);
template std::vector<double> SharedAlpha<double>::table(const TablePlan&, bool, bool) const;

#define DM_INSTANTIATE_PLAN(count_t) \
  template TablePlan plan_table<count_t>(const count_t*, int64_t, int64_t, bool);
DM_FOR_EACH_COUNT_TYPE(DM_INSTANTIATE_PLAN)
#undef DM_INSTANTIATE_PLAN

}  // namespace cpu
}  // namespace dirmult
