// CPU kernels for dirmult::log_lik_components (the (B, K) matrix of
// per-component log-likelihoods: a mixture's E-step, a classifier's scores)
// and its backward. Each row's nonzero counts are gathered once and scored
// against all K components.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "dirmult/math.h"

namespace dirmult {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

template <typename scalar_t>
struct ComponentTable {
  std::vector<scalar_t> alpha;
  std::vector<ExactFactors<scalar_t>> factors;
  std::vector<double> total;  // A_k
  std::vector<char> finite;

  ComponentTable(const scalar_t* la, int64_t K, int64_t V)
      : alpha(K * V), factors(K * V), total(K, 0.0), finite(K, 1) {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t v = 0; v < V; ++v) {
        const int64_t i = k * V + v;
        finite[k] = finite[k] && is_finite(la[i]);
        alpha[i] = dm_exp(la[i]);
        factors[i] = exact_factors(alpha[i]);
        total[k] += static_cast<double>(alpha[i]);
      }
    }
  }
};

// Gathers row b's nonzero valid entries; returns false when a count is invalid.
template <typename scalar_t, typename count_t>
bool gather_row(const count_t* row, int64_t V, std::vector<int64_t>& idx,
                std::vector<scalar_t>& val, double& N) {
  idx.clear();
  val.clear();
  N = 0.0;
  bool ok = true;
  for (int64_t v = 0; v < V; ++v) {
    const scalar_t n = static_cast<scalar_t>(row[v]);
    if (n == scalar_t(0)) continue;
    if (!is_valid_count(n)) {  // the row is NaN; its terms are not evaluated
      ok = false;
      continue;
    }
    N += static_cast<double>(row[v]);
    idx.push_back(v);
    val.push_back(n);
  }
  return ok;
}


}  // namespace

Tensor log_lik_components_cpu(Tensor counts, Tensor log_alpha, bool normalize) {
  check_components(counts, log_alpha);
  counts = as_contiguous(counts);
  log_alpha = as_contiguous(log_alpha);
  const int64_t B = counts.size(0), V = counts.size(1), K = log_alpha.size(0);
  Tensor out = torch::stable::new_empty(log_alpha, {B, K});
  if (out.numel() == 0) return out;
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    const ComponentTable<scalar_t> tab(
        static_cast<const scalar_t*>(log_alpha.const_data_ptr()), K, V);
    const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
    auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
      torch::stable::parallel_for(0, B, 16, [&](int64_t b0, int64_t b1) {
        std::vector<int64_t> idx;
        std::vector<scalar_t> val;
        for (int64_t b = b0; b < b1; ++b) {
          double N;
          const bool ok = gather_row<scalar_t, count_t>(n + b * V, V, idx, val, N);
          double common = normalize ? log_factorial<double>(N) : 0.0;
          if (normalize) {
            for (scalar_t x : val) common -= static_cast<double>(log_factorial(x));
          }
          for (int64_t k = 0; k < K; ++k) {
            double s = 0.0;
            for (size_t j = 0; j < idx.size(); ++j) {
              const int64_t i = k * V + idx[j];
              s += lnpoch(tab.factors[i], tab.alpha[i], la[i], val[j]);
            }
            const double A = tab.total[k];
            const double r = s - lnpoch<double>(A, std::log(A), N) + common;
            o[b * K + k] = static_cast<scalar_t>(ok && tab.finite[k] ? r : kNaN);
          }
        }
      });
    });
  });
  return out;
}

Tensor log_lik_components_backward_cpu(Tensor grad, Tensor counts, Tensor log_alpha) {
  check_components_backward(grad, counts, log_alpha);
  counts = as_contiguous(counts);
  log_alpha = as_contiguous(log_alpha);
  grad = as_contiguous(grad);
  const int64_t B = counts.size(0), V = counts.size(1), K = log_alpha.size(0);
  Tensor grad_la = torch::stable::new_zeros(log_alpha, log_alpha.sizes());
  if (B == 0 || V == 0 || K == 0) return grad_la;
  // Fixed row partition (shape-only) so the result is reproducible.
  const int64_t max_blocks = std::max<int64_t>(1, (int64_t{1} << 23) / (K * V));
  const int64_t nblk = std::max<int64_t>(1, std::min<int64_t>({(B + 255) / 256, 64, max_blocks}));
  const int64_t rows_per = (B + nblk - 1) / nblk;
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    const ComponentTable<scalar_t> tab(
        static_cast<const scalar_t*>(log_alpha.const_data_ptr()), K, V);
    const auto* g = static_cast<const scalar_t*>(grad.const_data_ptr());
    auto* out = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
    std::vector<double> col(nblk * K * V, 0.0), s_part(nblk * K, 0.0);
    DM_DISPATCH_COUNTS(counts.scalar_type(), [&] {
      const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
      torch::stable::parallel_for(0, nblk, 1, [&](int64_t p0, int64_t p1) {
        std::vector<int64_t> idx;
        std::vector<scalar_t> val;
        for (int64_t p = p0; p < p1; ++p) {
          double* c = col.data() + p * K * V;
          double* s = s_part.data() + p * K;
          for (int64_t b = p * rows_per; b < std::min(B, (p + 1) * rows_per); ++b) {
            double N;
            const bool ok = gather_row<scalar_t, count_t>(n + b * V, V, idx, val, N);
            for (int64_t k = 0; k < K; ++k) {
              const double gk = static_cast<double>(g[b * K + k]);
              if (gk == 0.0) continue;  // zero_weight_rows (src/cuda/backward_kernels.cuh)
              for (size_t j = 0; j < idx.size(); ++j) {
                const int64_t i = k * V + idx[j];
                c[i] += gk * static_cast<double>(adpoch(tab.factors[i], tab.alpha[i], val[j]));
              }
              s[k] += ok ? gk * dpoch<double>(tab.total[k], N) : kNaN;
            }
          }
        }
      });
    });
    for (int64_t k = 0; k < K; ++k) {
      double S = tab.finite[k] ? 0.0 : kNaN;
      for (int64_t p = 0; p < nblk; ++p) S += s_part[p * K + k];
      for (int64_t v = 0; v < V; ++v) {
        double c = 0.0;
        for (int64_t p = 0; p < nblk; ++p) c += col[(p * K + k) * V + v];
        out[k * V + v] = static_cast<scalar_t>(c - static_cast<double>(tab.alpha[k * V + v]) * S);
      }
    }
  });
  return grad_la;
}

}  // namespace dirmult
