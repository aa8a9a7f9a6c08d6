// dirmult::log_lik_regression and its backward on CPU. The rows go in
// blocks of kRegressionBlockRows: a block's log concentrations X W + bias
// (and in the backward its gradient G) in a buffer of rows x V values (never
// a (B, V) tensor) from register tiles, then per row the per-sample path's
// terms (per_sample_avx2's blocks for float32, as log_lik); the backward's
// dX = G W^T per block and dW, dbias partials X^T G over a fixed partition
// of the rows (regression_row_blocks), added in order: See Note [Regression
// fusion] and Note [Determinism].
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../common/op_args.h"
#include "cpu_simd.h"
#include "dirmult/math.h"
#include "ops_cpu.h"
#include "per_sample_avx2.h"
#include "per_sample_rows_cpu.h"
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

// Whether the AVX2 tiles multiply-add with one rounding (FMA). Off: each
// product and sum rounded apart, as the scalar loops do, so log_alpha is the
// same bits with or without AVX2 and as row_log_alpha's; FMA measured about
// 10% faster only at P = 64 (docs/PERFORMANCE_LEDGER.md, CPU).
constexpr bool kRegressionFma = false;

// la[0 .. V) = bias + sum_p x[p] W[p, :], the terms added in order of p.
template <typename S>
void row_log_alpha(const Design<S>& d, const S* x, S* la) {
  if (d.bias != nullptr) {
    std::copy(d.bias, d.bias + d.V, la);
  } else {
    std::fill(la, la + d.V, S(0));
  }
  for (int64_t p = 0; p < d.P; ++p) {
    const S xp = x[p];
    const S* w = d.W + p * d.V;
    for (int64_t v = 0; v < d.V; ++v) la[v] += xp * w[v];
  }
}

#ifdef DM_CPU_AVX2
#define DM_AVX2 __attribute__((target("avx2,fma")))

template <typename S>
struct Vec;

template <>
struct Vec<float> {
  using R = __m256;
  static constexpr int L = 8;
  DM_AVX2 static R load(const float* p) { return _mm256_loadu_ps(p); }
  DM_AVX2 static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  DM_AVX2 static R set1(float x) { return _mm256_set1_ps(x); }
  DM_AVX2 static R zero() { return _mm256_setzero_ps(); }
  DM_AVX2 static R madd(R a, R b, R c) {
    return kRegressionFma ? _mm256_fmadd_ps(a, b, c) : _mm256_add_ps(_mm256_mul_ps(a, b), c);
  }
  // p[0 .. 8) += x, in double.
  DM_AVX2 static void add_to(double* p, R x) {
    _mm256_storeu_pd(p, _mm256_add_pd(_mm256_loadu_pd(p), _mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    _mm256_storeu_pd(p + 4, _mm256_add_pd(_mm256_loadu_pd(p + 4),
                                          _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
  }
};

template <>
struct Vec<double> {
  using R = __m256d;
  static constexpr int L = 4;
  DM_AVX2 static R load(const double* p) { return _mm256_loadu_pd(p); }
  DM_AVX2 static void store(double* p, R x) { _mm256_storeu_pd(p, x); }
  DM_AVX2 static R set1(double x) { return _mm256_set1_pd(x); }
  DM_AVX2 static R zero() { return _mm256_setzero_pd(); }
  DM_AVX2 static R madd(R a, R b, R c) {
    return kRegressionFma ? _mm256_fmadd_pd(a, b, c) : _mm256_add_pd(_mm256_mul_pd(a, b), c);
  }
  DM_AVX2 static void add_to(double* p, R x) { _mm256_storeu_pd(p, _mm256_add_pd(_mm256_loadu_pd(p), x)); }
};

template <typename S>
DM_AVX2 inline S scalar_madd(S a, S b, S c) {
  if constexpr (kRegressionFma) {
    return std::fma(a, b, c);
  } else {
    return a * b + c;
  }
}

// The lanes' sum in a fixed tree.
template <typename S, typename R>
DM_AVX2 inline S lane_sum(R x) {
  alignas(32) S t[Vec<S>::L];
  Vec<S>::store(t, x);
  if constexpr (Vec<S>::L == 8) {
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  } else {
    return (t[0] + t[1]) + (t[2] + t[3]);
  }
}

// eta (n x V) = bias + x_i W for the rows x[0 .. n): tiles of 4 rows x 2L
// columns in registers over p (bias first, then p in order, as
// row_log_alpha). Rows past n repeat the last one; they are not stored.
template <typename S>
DM_AVX2 void eta_block_avx2(const Design<S>& d, const S* const* xr, int n, S* eta) {
  using Vc = Vec<S>;
  using R = typename Vc::R;
  constexpr int L = Vc::L;
  const int64_t P = d.P, V = d.V, Vv = V - V % (2 * L);
  for (int r0 = 0; r0 < n; r0 += 4) {
    const int rr = std::min(4, n - r0);
    const S* x[4];
    for (int j = 0; j < 4; ++j) x[j] = xr[r0 + std::min(j, rr - 1)];
    for (int64_t v = 0; v < Vv; v += 2 * L) {
      const R b0 = d.bias != nullptr ? Vc::load(d.bias + v) : Vc::zero();
      const R b1 = d.bias != nullptr ? Vc::load(d.bias + v + L) : Vc::zero();
      R acc[4][2];
      for (int j = 0; j < 4; ++j) acc[j][0] = b0, acc[j][1] = b1;
      const S* w = d.W + v;
      for (int64_t p = 0; p < P; ++p, w += V) {
        const R w0 = Vc::load(w), w1 = Vc::load(w + L);
        for (int j = 0; j < 4; ++j) {
          const R xb = Vc::set1(x[j][p]);
          acc[j][0] = Vc::madd(xb, w0, acc[j][0]);
          acc[j][1] = Vc::madd(xb, w1, acc[j][1]);
        }
      }
      for (int j = 0; j < rr; ++j) {
        Vc::store(eta + (r0 + j) * V + v, acc[j][0]);
        Vc::store(eta + (r0 + j) * V + v + L, acc[j][1]);
      }
    }
    for (int j = 0; j < rr; ++j) {
      for (int64_t v = Vv; v < V; ++v) {
        S s = d.bias != nullptr ? d.bias[v] : S(0);
        for (int64_t p = 0; p < P; ++p) s = scalar_madd(x[j][p], d.W[p * V + v], s);
        eta[(r0 + j) * V + v] = s;
      }
    }
  }
}

// dx_i[p] = sum_v G[i, v] W[p, v] for the rows i < n: tiles of 4 rows x 3
// p, each sum in L lanes over v, the lanes in a fixed tree, then the
// columns past the last whole vector in order.
template <typename S>
DM_AVX2 void dx_block_avx2(const S* G, int n, const S* W, int64_t P, int64_t V, S* const* dx) {
  using Vc = Vec<S>;
  using R = typename Vc::R;
  constexpr int L = Vc::L;
  const int64_t Vv = V - V % L;
  for (int r0 = 0; r0 < n; r0 += 4) {
    const int rr = std::min(4, n - r0);
    const S* g[4];
    for (int j = 0; j < 4; ++j) g[j] = G + (r0 + std::min(j, rr - 1)) * V;
    for (int64_t p0 = 0; p0 < P; p0 += 3) {
      const int qq = static_cast<int>(std::min<int64_t>(3, P - p0));
      const S* w[3];
      for (int q = 0; q < 3; ++q) w[q] = W + (p0 + std::min(q, qq - 1)) * V;
      R acc[4][3];
      for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = Vc::zero();
      for (int64_t v = 0; v < Vv; v += L) {
        const R w0 = Vc::load(w[0] + v), w1 = Vc::load(w[1] + v), w2 = Vc::load(w[2] + v);
        for (int j = 0; j < 4; ++j) {
          const R gv = Vc::load(g[j] + v);
          acc[j][0] = Vc::madd(gv, w0, acc[j][0]);
          acc[j][1] = Vc::madd(gv, w1, acc[j][1]);
          acc[j][2] = Vc::madd(gv, w2, acc[j][2]);
        }
      }
      for (int j = 0; j < rr; ++j) {
        for (int q = 0; q < qq; ++q) {
          S s = lane_sum<S>(acc[j][q]);
          for (int64_t v = Vv; v < V; ++v) s = scalar_madd(g[j][v], w[q][v], s);
          dx[r0 + j][p0 + q] = s;
        }
      }
    }
  }
}

// pw[p, v] += sum_{i < n} XT[p, i] G[i, v] (XT: Q x n), the block's sum in
// S over its rows in order, then added to the double partials: tiles of 4 p
// x 2L columns.
template <typename S>
DM_AVX2 void dw_block_avx2(const S* XT, int n, const S* G, int64_t Q, int64_t V, double* pw) {
  using Vc = Vec<S>;
  using R = typename Vc::R;
  constexpr int L = Vc::L;
  const int64_t Vv = V - V % (2 * L);
  for (int64_t p0 = 0; p0 < Q; p0 += 4) {
    const int qq = static_cast<int>(std::min<int64_t>(4, Q - p0));
    const S* xt[4];
    for (int q = 0; q < 4; ++q) xt[q] = XT + (p0 + std::min(q, qq - 1)) * n;
    for (int64_t v = 0; v < Vv; v += 2 * L) {
      R acc[4][2];
      for (int q = 0; q < 4; ++q) acc[q][0] = acc[q][1] = Vc::zero();
      const S* g = G + v;
      for (int i = 0; i < n; ++i, g += V) {
        const R g0 = Vc::load(g), g1 = Vc::load(g + L);
        for (int q = 0; q < 4; ++q) {
          const R xb = Vc::set1(xt[q][i]);
          acc[q][0] = Vc::madd(xb, g0, acc[q][0]);
          acc[q][1] = Vc::madd(xb, g1, acc[q][1]);
        }
      }
      for (int q = 0; q < qq; ++q) {
        Vc::add_to(pw + (p0 + q) * V + v, acc[q][0]);
        Vc::add_to(pw + (p0 + q) * V + v + L, acc[q][1]);
      }
    }
    for (int q = 0; q < qq; ++q) {
      for (int64_t v = Vv; v < V; ++v) {
        S s = S(0);
        for (int i = 0; i < n; ++i) s = scalar_madd(xt[q][i], G[i * V + v], s);
        pw[(p0 + q) * V + v] += static_cast<double>(s);
      }
    }
  }
}
#endif  // DM_CPU_AVX2

// The products on a block of rows, by the AVX2 tiles where
// per_sample_avx2_available(), else by plain loops (products in double).
template <typename S>
void eta_block(const Design<S>& d, const S* const* xr, int n, S* eta, bool simd) {
#ifdef DM_CPU_AVX2
  if (simd) return eta_block_avx2(d, xr, n, eta);
#endif
  for (int i = 0; i < n; ++i) row_log_alpha(d, xr[i], eta + i * d.V);
}

template <typename S>
void dx_block(const S* G, int n, const S* W, int64_t P, int64_t V, S* const* dx, bool simd) {
#ifdef DM_CPU_AVX2
  if (simd) return dx_block_avx2(G, n, W, P, V, dx);
#endif
  for (int i = 0; i < n; ++i) {
    for (int64_t p = 0; p < P; ++p) {
      double s = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        s += static_cast<double>(G[i * V + v]) * static_cast<double>(W[p * V + v]);
      }
      dx[i][p] = static_cast<S>(s);
    }
  }
}

template <typename S>
void dw_block(const S* XT, int n, const S* G, int64_t Q, int64_t V, double* pw, bool simd) {
#ifdef DM_CPU_AVX2
  if (simd) return dw_block_avx2(XT, n, G, Q, V, pw);
#endif
  for (int64_t p = 0; p < Q; ++p) {
    for (int i = 0; i < n; ++i) {
      const double xp = static_cast<double>(XT[p * n + i]);
      for (int64_t v = 0; v < V; ++v) pw[p * V + v] += xp * static_cast<double>(G[i * V + v]);
    }
  }
}

// A row's sums under its own concentrations (log_lik's per-sample scalar
// path): zero counts still add their alpha to A.
template <typename S, typename C>
RowSums regression_row_sums(const C* row, const S* la, int64_t V, bool normalize) {
  if constexpr (std::is_same_v<S, float>) {
    if (per_sample_avx2_available()) return per_sample_sums_avx2<C>(row, la, 0, V, normalize);
  }
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
  const int64_t R = kRegressionBlockRows, V = d.V;
  const bool simd = per_sample_avx2_available();
  const int64_t blocks = (B + R - 1) / R;
  torch::stable::parallel_for(0, blocks, parallel_grain(R * V), [&](int64_t k0, int64_t k1) {
    std::vector<S> eta(static_cast<size_t>(R * V));
    const S* xr[kRegressionBlockRows];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t b0 = k * R;
      const int n = static_cast<int>(std::min(R, B - b0));
      for (int i = 0; i < n; ++i) xr[i] = d.X + (b0 + i) * d.P;
      eta_block(d, xr, n, eta.data(), simd);
      for (int i = 0; i < n; ++i) {
        const RowSums r =
            regression_row_sums<S, C>(counts + (b0 + i) * V, eta.data() + i * V, V, normalize);
        out[b0 + i] = static_cast<S>(r.ok ? r.s + row_term(row_log_total(r.A, eta.data() + i * V, V), r.N, normalize) : kNaN);
      }
    }
  });
}

// G[v] = g (adpoch(a_v, n_v) - a_v dpoch(A, N)), the gradient of g log_lik
// with respect to the row's log concentrations (log_lik_backward's
// per-sample rows); NaN for a bad row.
template <typename S, typename C>
void row_gradient(const C* row, const S* la, int64_t V, double g, S* G) {
  double N = 0.0, A = 0.0;
  bool ok = true;
  for (int64_t v = 0; v < V; ++v) {
    ok = ok && is_valid_count(static_cast<S>(row[v]));
    N += static_cast<double>(row[v]);
  }
  bool simd = false;
  if constexpr (std::is_same_v<S, float>) simd = per_sample_avx2_available();
  if constexpr (std::is_same_v<S, float>) {
    if (simd) A = per_sample_alpha_sum_avx2(la, V, ok);
  }
  if (!simd) {
    for (int64_t v = 0; v < V; ++v) {
      ok = ok && is_finite(la[v]);
      A += static_cast<double>(dm_exp(la[v]));
    }
  }
  const LogTotal LA = row_log_total(A, la, V);
  const double d = LA.row_weight(ok ? N : kNaN);  // a bad row: NaN throughout
  auto scalar_term = [&](int64_t v) {
    const S a = dm_exp(la[v]);
    const S n = static_cast<S>(row[v]);
    const double t = is_valid_count(n) ? static_cast<double>(adpoch(a, n)) : kNaN;
    G[v] = static_cast<S>(g * (t - LA.column_factor(a, la[v]) * d));
  };
  if constexpr (std::is_same_v<S, float>) {
    if (simd && !LA.scaled) {  // (the lanes take a_v d)
      per_sample_grad_avx2<C>(row, la, V, g, d, G, scalar_term);
      return;
    }
  }
  for (int64_t v = 0; v < V; ++v) scalar_term(v);
}

// dX (B, P), dW (P, V) and dbias (V,) (nullptr: no bias). A row whose
// incoming gradient is exactly 0 adds nothing (See Note [Zero-weight rows]):
// each fixed block's other rows go in sub-blocks of kRegressionBlockRows,
// in order, whose X^T G (and G's column sums, a row of ones in XT) add to
// the block's double partials.
template <typename S, typename C>
void regression_backward(const S* grad, const C* counts, const Design<S>& d, int64_t B,
                         S* dX, S* dW, S* dbias) {
  const int64_t P = d.P, V = d.V, R = kRegressionBlockRows;
  const bool simd = per_sample_avx2_available();
  const int64_t blocks = regression_row_blocks(B, P, V);
  const int64_t rows_per_block = (B + blocks - 1) / blocks;
  const int64_t stride = (P + 1) * V;  // a block's partials: dW (P, V), then dbias (V,)
  const int64_t Q = dbias != nullptr ? P + 1 : P;
  std::vector<double> partial(static_cast<size_t>(blocks * stride), 0.0);
  torch::stable::parallel_for(0, blocks, parallel_grain(rows_per_block * V), [&](int64_t k0, int64_t k1) {
    std::vector<S> eta(static_cast<size_t>(R * V)), G(static_cast<size_t>(R * V));
    std::vector<S> XT(static_cast<size_t>((P + 1) * R));
    const S* xr[kRegressionBlockRows];
    S* dxr[kRegressionBlockRows];
    int64_t rows[kRegressionBlockRows];
    for (int64_t k = k0; k < k1; ++k) {
      double* pw = partial.data() + k * stride;
      int n = 0;
      auto flush = [&]() {
        if (n == 0) return;
        eta_block(d, xr, n, eta.data(), simd);
        for (int i = 0; i < n; ++i) {
          row_gradient<S, C>(counts + rows[i] * V, eta.data() + i * V, V,
                             static_cast<double>(grad[rows[i]]), G.data() + i * V);
        }
        dx_block(G.data(), n, d.W, P, V, dxr, simd);
        for (int64_t p = 0; p < P; ++p) {
          for (int i = 0; i < n; ++i) XT[p * n + i] = xr[i][p];
        }
        if (dbias != nullptr) std::fill(XT.data() + P * n, XT.data() + (P + 1) * n, S(1));
        dw_block(XT.data(), n, G.data(), Q, V, pw, simd);
        n = 0;
      };
      const int64_t b_end = std::min(B, (k + 1) * rows_per_block);
      for (int64_t b = k * rows_per_block; b < b_end; ++b) {
        if (grad[b] == S(0)) {
          std::fill(dX + b * P, dX + (b + 1) * P, S(0));
          continue;
        }
        rows[n] = b, xr[n] = d.X + b * P, dxr[n] = dX + b * P;
        if (++n == R) flush();
      }
      flush();
    }
  });
  const int64_t outputs = dbias != nullptr ? stride : P * V;
  torch::stable::parallel_for(0, outputs, parallel_grain(blocks, 1024), [&](int64_t i0, int64_t i1) {
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
