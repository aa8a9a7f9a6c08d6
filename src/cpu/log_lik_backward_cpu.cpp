// dirmult::log_lik_backward on CPU. Shared alpha: the column gradients of a
// fixed partition of the rows (gradient_row_blocks), the partials then added
// in order, so the result is the same bits for any thread count (See Note
// [Determinism]); a few long rows sum their columns in parallel instead.
// Per-sample alpha and the counts gradient: elementwise after each row's
// totals.
#include "log_lik_backward_cpu.h"

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/op_args.h"
#include "dirmult/math.h"
#include "ops_cpu.h"
#include "per_sample_avx2.h"
#include "per_sample_rows_cpu.h"
#include "policy_cpu.h"
#include "row_sums_cpu.h"
#include "shared_rows_avx2.h"
#include "tables_cpu.h"

namespace dirmult {
namespace cpu {
namespace {

// A row's count total over columns [v0, v1) and, for per-sample alpha, its
// concentration total; ok is false for a bad count or concentration.
template <typename scalar_t, typename count_t>
RowSums row_count_sums(const count_t* counts, const scalar_t* la, bool shared, int64_t b,
                       int64_t V, int64_t v0, int64_t v1) {
  const count_t* row = counts + b * V;
  RowSums r;
  // Four partial sums and the validity as a plain AND: one ordered chain of
  // dependent double adds bounds the loop (docs/PERFORMANCE_LEDGER.md, CPU). The same N
  // for integer counts (exact in double below 2^53); for fractional ones
  // within a rounding or so of the ordered sum.
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
                int64_t b, int64_t V, const LogTotal& shared_A, double& N, LogTotal& A) {
  const RowSums r = row_count_sums<scalar_t, count_t>(counts, la, shared, b, V, 0, V);
  N = r.ok ? r.N : kNaN;
  A = shared ? shared_A : row_log_total(r.A, la + b * V, V);
}

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
    if (g != 0.0) S += N[b] == N[b] ? g * sa.log_total.row_weight(N[b]) : kNaN;
  }
  if (!sa.finite) S = kNaN;
  torch::stable::parallel_for(0, V, parallel_grain(B, kColumnChunk / 4), [&](int64_t v0, int64_t v1) {
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
            grad_la[v + j] = static_cast<scalar_t>(
                c[j] - sa.log_total.column_factor(sa.alpha[v + j], sa.log_alpha[v + j]) * S);
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
        const count_t x = counts[b * V + v];
        c += static_cast<double>(grad[b]) * (count_rounds<scalar_t>(x)
                                                 ? count_adpoch_f64(sa.log_alpha[v], x)
                                                 : static_cast<double>(term(v, n)));
      }
      grad_la[v] = static_cast<scalar_t>(
          c - sa.log_total.column_factor(sa.alpha[v], sa.log_alpha[v]) * S);
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
    c[v] += g * (count_rounds<scalar_t>(row[v]) ? count_adpoch_f64(sa.log_alpha[v], row[v])
                                                : static_cast<double>(
                                                      adpoch(sa.factors[v], sa.alpha[v], n)));
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
  auto add = [&](int64_t v) DM_ALWAYS_INLINE {
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
  // (lambdas through a helper) makes both loops slower (GCC codegen).
  int64_t v = 0;
  for (; v + 16 <= V; v += 16) {
    if (all_zeros<16>(row + v)) continue;
    for (int i = 0; i < 16; ++i) add(v + i);
  }
  for (; v < V; ++v) add(v);
  return ok ? static_cast<double>(table_N) + rare_N : kNaN;
}

}  // namespace

template <typename scalar_t, typename count_t, bool kRows>
void backward_shared(const scalar_t* grad, const count_t* counts, const scalar_t* la, int64_t B,
                     int64_t V, scalar_t* grad_la, RowOutputs<scalar_t> rows,
                     const TablePlan* given_plan) {
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
  if (!kRows && few_long_rows(B, V)) {
    backward_shared_few_rows<scalar_t, count_t>(grad, counts, sa, B, V, term, table.empty(),
                                                grad_la);
    return;
  }
  // Fixed partition of rows into blocks; depends on (B, V) only.
  const int64_t nblk = gradient_row_blocks(B, V);
  const int64_t rows_per = (B + nblk - 1) / nblk;
  std::vector<double> col(nblk * V, 0.0), s_part(nblk, 0.0);
  torch::stable::parallel_for(0, nblk, parallel_grain(rows_per * V), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      double* c = col.data() + k * V;
      double s = 0.0;
      for (int64_t b = k * rows_per; b < std::min(B, (k + 1) * rows_per); ++b) {
        const count_t* row = counts + b * V;
        const double g = grad != nullptr ? static_cast<double>(grad[b]) : 1.0;
        if (g == 0.0) continue;  // See Note [Zero-weight rows]
        const double N = add_row_gradient<scalar_t, count_t>(row, V, g, table, sa, c);
        s += N == N ? g * sa.log_total.row_weight(N) : kNaN;
        if constexpr (kRows) {
          // The row's log-likelihood summed as forward_rows sums it (the
          // same bits), in a second pass over the row, from the cache.
          const RowSums r = lnp_row_sums<scalar_t, count_t>(row, 0, V, lnp, sa, rows.normalize);
          rows.out[b] = static_cast<scalar_t>(
              r.ok && sa.finite ? r.s + row_term(sa.log_total, r.N, rows.normalize) : kNaN);
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
    grad_la[v] = static_cast<scalar_t>(c - sa.log_total.column_factor(sa.alpha[v], la[v]) * S);
  }
}

#define DM_INSTANTIATE_BACKWARD_ROWS(scalar_t, count_t, kRows)                                  \
  template void backward_shared<scalar_t, count_t, kRows>(                                     \
      const scalar_t*, const count_t*, const scalar_t*, int64_t, int64_t, scalar_t*,           \
      RowOutputs<scalar_t>, const TablePlan*);
#define DM_INSTANTIATE_BACKWARD(count_t)                \
  DM_INSTANTIATE_BACKWARD_ROWS(float, count_t, false)   \
  DM_INSTANTIATE_BACKWARD_ROWS(float, count_t, true)    \
  DM_INSTANTIATE_BACKWARD_ROWS(double, count_t, false)  \
  DM_INSTANTIATE_BACKWARD_ROWS(double, count_t, true)
DM_FOR_EACH_COUNT_TYPE(DM_INSTANTIATE_BACKWARD)
#undef DM_INSTANTIATE_BACKWARD
#undef DM_INSTANTIATE_BACKWARD_ROWS

namespace {

// Elementwise gradients that need the row totals first: per-sample
// grad_log_alpha and/or grad_counts.
template <typename scalar_t, typename count_t>
void backward_rows(const scalar_t* grad, const count_t* counts,
                   const scalar_t* la, bool shared, int64_t B, int64_t V,
                   bool normalize, scalar_t* grad_la, scalar_t* grad_counts) {
  const LogTotal shared_A = shared ? SharedAlpha<scalar_t>(la, V).log_total : LogTotal{};
  torch::stable::parallel_for(0, B, parallel_grain(V, 16), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double N;
      LogTotal LA;
      row_totals<scalar_t, count_t>(counts, la, shared, b, V, shared_A, N, LA);
      const double A = LA.A;
      const double g = static_cast<double>(grad[b]);
      const scalar_t* lrow = shared ? la : la + b * V;
      const count_t* row = counts + b * V;
      if (grad_la != nullptr) {
        const double d = LA.row_weight(N);
        // (A bad count makes N, d and the row's gradient NaN.)
        auto scalar_term = [&](int64_t v) {
          const scalar_t a = dm_exp(lrow[v]);
          const scalar_t n = static_cast<scalar_t>(row[v]);
          const double t = !is_valid_count(n)           ? kNaN
                           : count_rounds<scalar_t>(row[v]) ? count_adpoch_f64(lrow[v], row[v])
                                                            : static_cast<double>(adpoch(a, n));
          grad_la[b * V + v] =
              static_cast<scalar_t>(g * (t - LA.column_factor(a, lrow[v]) * d));
        };
        bool done = false;
        if constexpr (std::is_same_v<scalar_t, float>) {
          // (A scaled total's rows take the scalar path: the lanes take a_v d.)
          if (!shared && !LA.scaled && cpu::per_sample_avx2_available()) {
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

}  // namespace

std::tuple<Tensor, Tensor> log_lik_backward_cpu(Tensor grad, Tensor counts, Tensor log_alpha,
                                                bool normalize, bool counts_grad) {
  const LogLikBackwardArgs<CpuDevice> a(grad, counts, log_alpha);
  Tensor grad_la = torch::stable::new_zeros(a.log_alpha, a.log_alpha.sizes());
  Tensor grad_counts =
      torch::stable::new_zeros(a.log_alpha, counts_grad_shape(a.counts, counts_grad));
  if (a.empty()) return {grad_la, grad_counts};
  a.dispatch([&](auto t) {
    auto* gla = t.out(grad_la);
    auto* gc = counts_grad ? t.out(grad_counts) : nullptr;
    if (a.shared) backward_shared(t.grad, t.counts, t.log_alpha, a.B, a.V, gla);
    if (!a.shared || gc != nullptr) {
      backward_rows(t.grad, t.counts, t.log_alpha, a.shared, a.B, a.V, normalize,
                    a.shared ? nullptr : gla, gc);
    }
  });
  return {grad_la, grad_counts};
}

}  // namespace cpu
}  // namespace dirmult
