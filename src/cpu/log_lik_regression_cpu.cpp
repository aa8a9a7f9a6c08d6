// dirmult::log_lik_regression and its backward on CPU. Per row, the log
// concentrations X[b] W + bias go to a buffer of V values (never a (B, V)
// tensor), then the per-sample scalar path's terms. The backward's dW and
// dbias are partial sums over a fixed partition of the rows
// (regression_row_blocks), added in order: See Note [Regression fusion] and
// Note [Determinism].
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "../common/op_args.h"
#include "dirmult/math.h"
#include "ops_cpu.h"
#include "policy_cpu.h"
#include "row_sums_cpu.h"

namespace dirmult {
namespace cpu {
namespace {

template <typename S>
struct Design {
  const S* X;     // (B, P)
  const S* W;     // (P, V)
  const S* bias;  // (V,) or nullptr
  int64_t P, V;
};

// la[0 .. V) = bias + sum_p X[b, p] W[p, :], the terms added in order of p.
template <typename S>
void row_log_alpha(const Design<S>& d, int64_t b, S* la) {
  if (d.bias != nullptr) {
    std::copy(d.bias, d.bias + d.V, la);
  } else {
    std::fill(la, la + d.V, S(0));
  }
  const S* x = d.X + b * d.P;
  for (int64_t p = 0; p < d.P; ++p) {
    const S xp = x[p];
    const S* w = d.W + p * d.V;
    for (int64_t v = 0; v < d.V; ++v) la[v] += xp * w[v];
  }
}

// A row's sums under its own concentrations (log_lik's per-sample scalar
// path): zero counts still add their alpha to A.
template <typename S, typename C>
RowSums regression_row_sums(const C* row, const S* la, int64_t V, bool normalize) {
  RowSums r;
  for (int64_t v = 0; v < V; ++v) {
    const S a = dm_exp(la[v]);
    r.ok = r.ok && is_finite(la[v]);
    r.A += static_cast<double>(a);
    const S n = static_cast<S>(row[v]);
    if (n == S(0)) continue;
    if (!is_valid_count(n)) {  // the row is NaN; no term for it
      r.ok = false;
      continue;
    }
    r.N += static_cast<double>(row[v]);
    r.s += static_cast<double>(lnpoch(a, la[v], n));
    if (normalize) r.s -= static_cast<double>(log_factorial(n));
  }
  return r;
}

template <typename S, typename C>
void regression_forward(const C* counts, const Design<S>& d, int64_t B, bool normalize, S* out) {
  torch::stable::parallel_for(0, B, kRegressionRowGrain, [&](int64_t b0, int64_t b1) {
    std::vector<S> la(d.V);
    for (int64_t b = b0; b < b1; ++b) {
      row_log_alpha(d, b, la.data());
      const RowSums r = regression_row_sums<S, C>(counts + b * d.V, la.data(), d.V, normalize);
      out[b] = static_cast<S>(r.ok ? r.s + row_term(r.A, r.N, normalize) : kNaN);
    }
  });
}

// G[v] = g (adpoch(a_v, n_v) - a_v dpoch(A, N)), the gradient of g log_lik
// with respect to the row's log concentrations; NaN for a bad row.
template <typename S, typename C>
void row_gradient(const C* row, const S* la, int64_t V, double g, double* G) {
  double N = 0.0, A = 0.0;
  bool ok = true;
  for (int64_t v = 0; v < V; ++v) {
    ok = ok && is_finite(la[v]);
    A += static_cast<double>(dm_exp(la[v]));
    const S n = static_cast<S>(row[v]);
    if (n == S(0)) continue;
    ok = ok && is_valid_count(n);
    N += static_cast<double>(row[v]);
  }
  if (!ok) {
    std::fill(G, G + V, kNaN);
    return;
  }
  const double dA = dpoch<double>(A, N);
  for (int64_t v = 0; v < V; ++v) {
    const S a = dm_exp(la[v]);
    const S n = static_cast<S>(row[v]);
    const double adp = n == S(0) ? 0.0 : static_cast<double>(adpoch(a, n));
    G[v] = g * (adp - static_cast<double>(a) * dA);
  }
}

// dX (B, P), dW (P, V) and dbias (V,) (nullptr: no bias). A row whose
// incoming gradient is exactly 0 adds nothing (See Note [Zero-weight rows]).
template <typename S, typename C>
void regression_backward(const S* grad, const C* counts, const Design<S>& d, int64_t B,
                         S* dX, S* dW, S* dbias) {
  const int64_t P = d.P, V = d.V;
  const int64_t blocks = regression_row_blocks(B, P, V);
  const int64_t rows_per_block = (B + blocks - 1) / blocks;
  const int64_t stride = (P + 1) * V;  // a block's partials: dW (P, V), then dbias (V,)
  std::vector<double> partial(static_cast<size_t>(blocks * stride), 0.0);
  torch::stable::parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
    std::vector<S> la(V);
    std::vector<double> G(V);
    for (int64_t k = k0; k < k1; ++k) {
      double* pw = partial.data() + k * stride;
      double* pb = pw + P * V;
      const int64_t b_end = std::min(B, (k + 1) * rows_per_block);
      for (int64_t b = k * rows_per_block; b < b_end; ++b) {
        const double g = static_cast<double>(grad[b]);
        S* dx = dX + b * P;
        if (g == 0.0) {
          std::fill(dx, dx + P, S(0));
          continue;
        }
        row_log_alpha(d, b, la.data());
        row_gradient<S, C>(counts + b * V, la.data(), V, g, G.data());
        const S* x = d.X + b * P;
        for (int64_t p = 0; p < P; ++p) {
          const S* w = d.W + p * V;
          double* acc = pw + p * V;
          const double xp = static_cast<double>(x[p]);
          double s = 0.0;
          for (int64_t v = 0; v < V; ++v) {
            s += G[v] * static_cast<double>(w[v]);
            acc[v] += xp * G[v];
          }
          dx[p] = static_cast<S>(s);
        }
        for (int64_t v = 0; v < V; ++v) pb[v] += G[v];
      }
    }
  });
  const int64_t outputs = dbias != nullptr ? stride : P * V;
  torch::stable::parallel_for(0, outputs, 1024, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      double s = 0.0;
      for (int64_t k = 0; k < blocks; ++k) s += partial[k * stride + i];
      if (i < P * V) {
        dW[i] = static_cast<S>(s);
      } else {
        dbias[i - P * V] = static_cast<S>(s);
      }
    }
  });
}

template <typename Typed>
Design<typename Typed::scalar_t> design_of(const Typed& t, int64_t P, int64_t V) {
  return {t.X, t.W, t.bias, P, V};
}

}  // namespace

Tensor log_lik_regression_cpu(Tensor counts, Tensor X, Tensor W, std::optional<Tensor> bias,
                              bool normalize) {
  const RegressionArgs<CpuDevice> a(counts, X, W, bias);
  // V = 0: every row is empty, log-likelihood 0.
  if (a.empty()) return torch::stable::new_zeros(a.X, {a.B});
  Tensor out = torch::stable::new_empty(a.X, {a.B});  // every row written
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    using C = typename decltype(t)::count_t;
    regression_forward<S, C>(t.counts, design_of(t, a.P, a.V), a.B, normalize, t.out(out));
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor> log_lik_regression_backward_cpu(Tensor grad, Tensor counts,
                                                                   Tensor X, Tensor W,
                                                                   std::optional<Tensor> bias,
                                                                   bool normalize) {
  // (normalize adds a term free of log_alpha: the gradient is the same.)
  const RegressionArgs<CpuDevice> a(grad, counts, X, W, bias);
  const int64_t bias_size = a.bias.has_value() ? a.V : 0;
  if (a.empty()) {
    return {torch::stable::new_zeros(a.X, {a.B, a.P}), torch::stable::new_zeros(a.X, {a.P, a.V}),
            torch::stable::new_zeros(a.X, {bias_size})};
  }
  // Every element of the three is written.
  Tensor dX = torch::stable::new_empty(a.X, {a.B, a.P});
  Tensor dW = torch::stable::new_empty(a.X, {a.P, a.V});
  Tensor dbias = torch::stable::new_empty(a.X, {bias_size});
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    using C = typename decltype(t)::count_t;
    regression_backward<S, C>(t.grad, t.counts, design_of(t, a.P, a.V), a.B, t.out(dX),
                              t.out(dW), a.bias.has_value() ? t.out(dbias) : nullptr);
  });
  return {dX, dW, dbias};
}

}  // namespace cpu
}  // namespace dirmult
