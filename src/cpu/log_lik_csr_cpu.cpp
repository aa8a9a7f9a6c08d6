// CPU kernels of dirmult::log_lik_csr and dirmult::log_lik_csr_backward:
// counts as CSR parts (row offsets, column indices, values), log_alpha (V,)
// shared or (K, V) components. Cost proportional to the nonzeros: a row's
// zeros contribute nothing to its sums (math.h), so only its stored values
// are visited. See Note [CSR inputs] and Note [CSR gradient].
//
// Forward: rows in parallel; per row N = sum of its values (double), the
// sum over its nonzeros of lnpoch(alpha[col], n) in double, minus lnpoch(A,
// N) in double, as the dense kernels (src/cpu/log_lik_cpu.cpp).
// Backward: columns in parallel over the column-sorted copy, each summing
// its rows in order; the row terms in fixed blocks of rows summed in order:
// the same bits for any thread count (Note [Determinism]).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../common/op_args.h"
#include "ops_cpu.h"
#include "policy_cpu.h"
#include "csr_alpha_cpu.h"
#include "tables_cpu.h"
#include "dirmult/math.h"

namespace dirmult {
namespace cpu {
namespace {

using namespace csr;

template <typename scalar_t, typename value_t, typename index_t>
void csr_forward(const index_t* crow, const index_t* col, const value_t* val, int64_t B,
                 int64_t nnz, const CsrAlpha<scalar_t>& p, bool normalize, scalar_t* out) {
  const int64_t K = p.K, V = p.V;
  const bool table = !p.table.empty();
  const auto& log_fact = small_log_factorials<scalar_t>();
  torch::stable::parallel_for(0, B, parallel_grain(csr_row_work(nnz, B, K), 64), [&](int64_t b0, int64_t b1) {
    std::vector<double> s(K);
    for (int64_t b = b0; b < b1; ++b) {
      int64_t j0, j1;
      bool ok = row_range(crow, b, nnz, j0, j1);
      std::fill(s.begin(), s.end(), 0.0);
      double N = 0.0;
      for (int64_t j = j0; ok && j < j1; ++j) {
        const int64_t c = static_cast<int64_t>(col[j]);
        const scalar_t n = static_cast<scalar_t>(val[j]);
        if (c < 0 || c >= V || !is_valid_count(n)) {
          ok = false;  // a column outside [0, V) or a bad count: the row is NaN
          break;
        }
        if (n == scalar_t(0)) continue;
        N += static_cast<double>(val[j]);
        if (table && is_exact_count(n)) {
          const int ni = static_cast<int>(n);
          const double lf = static_cast<double>(log_fact[ni]);
          const scalar_t* e = p.entries(c, ni);
          for (int64_t k = 0; k < K; ++k) {
            s[k] += static_cast<double>(e[k]);
            if (normalize) s[k] -= lf;
          }
          continue;
        }
        const scalar_t lf = normalize ? log_factorial(n) : scalar_t(0);
        const CsrColumn<scalar_t>* cs = p.cols.data() + c * K;
        for (int64_t k = 0; k < K; ++k) {
          s[k] += static_cast<double>(lnpoch(cs[k].f, cs[k].a, cs[k].log_a, n));
          if (normalize) s[k] -= static_cast<double>(lf);
        }
      }
      for (int64_t k = 0; k < K; ++k) {
        out[b * K + k] = static_cast<scalar_t>(
            ok && p.finite[k] ? s[k] + csr_row_term(p.log_A[k], N, normalize) : kNaN);
      }
    }
  });
}

// grad_la[k, v] = sum over column v's nonzeros j (row r) of g[r, k]
// adpoch(a_kv, n_j) - a_kv S_k, S_k = sum_b g[b, k] dpoch(A_k, N_b). Rows
// with g = 0 do not enter (as the dense backward: zero_weight_rows).
template <typename scalar_t, typename value_t, typename index_t>
void csr_backward(const scalar_t* grad, const index_t* crow, const value_t* val,
                  const index_t* csc_ptr, const index_t* csc_row, const value_t* csc_val,
                  int64_t B, int64_t nnz, const CsrAlpha<scalar_t>& p, scalar_t* grad_la) {
  const int64_t K = p.K, V = p.V;
  const int64_t blocks = (B + kCsrRowBlock - 1) / kCsrRowBlock;
  std::vector<double> part(blocks * K, 0.0);
  const int64_t grain = parallel_grain(kCsrRowBlock * csr_row_work(nnz, B, K));
  torch::stable::parallel_for(0, blocks, grain, [&](int64_t k0, int64_t k1) {
    for (int64_t blk = k0; blk < k1; ++blk) {
      for (int64_t b = blk * kCsrRowBlock; b < std::min(B, (blk + 1) * kCsrRowBlock); ++b) {
        int64_t j0, j1;
        double N = row_range(crow, b, nnz, j0, j1) ? 0.0 : kNaN;
        for (int64_t j = j0; N == N && j < j1; ++j) {
          const scalar_t n = static_cast<scalar_t>(val[j]);
          N = is_valid_count(n) ? N + static_cast<double>(val[j]) : kNaN;
        }
        for (int64_t k = 0; k < K; ++k) {
          const double g = static_cast<double>(grad[b * K + k]);
          if (g != 0.0) part[blk * K + k] += N == N ? g * p.log_A[k].row_weight(N) : kNaN;
        }
      }
    }
  });
  std::vector<double> S(K, 0.0);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t k = 0; k < K; ++k) S[k] += part[blk * K + k];
  }
  for (int64_t k = 0; k < K; ++k) {
    if (!p.finite[k]) S[k] = kNaN;
  }
  torch::stable::parallel_for(0, V, parallel_grain(K * (nnz / std::max<int64_t>(V, 1) + 1), 256),
                              [&](int64_t v0, int64_t v1) {
    std::vector<double> c(K);
    // adpoch(a_kv, n), n = 1 .. kMaxExactCount, of the column's components,
    // laid out (n, K), where the column has more nonzeros than entries.
    std::vector<scalar_t> ad(static_cast<size_t>(K * kMaxExactCount));
    for (int64_t v = v0; v < v1; ++v) {
      std::fill(c.begin(), c.end(), 0.0);
      const CsrColumn<scalar_t>* cs = p.cols.data() + v * K;
      const bool held = static_cast<int64_t>(csc_ptr[v + 1]) - static_cast<int64_t>(csc_ptr[v]) >
                        kMaxExactCount;
      if (held) {
        for (int64_t k = 0; k < K; ++k) adpoch_entries(cs[k], ad.data() + k, K);
      }
      int64_t j0 = static_cast<int64_t>(csc_ptr[v]), j1 = static_cast<int64_t>(csc_ptr[v + 1]);
      if (!(0 <= j0 && j0 <= j1 && j1 <= nnz)) {
        std::fill(c.begin(), c.end(), kNaN);
        j1 = j0;
      }
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t r = static_cast<int64_t>(csc_row[j]);
        const scalar_t n = static_cast<scalar_t>(csc_val[j]);
        if (r < 0 || r >= B) {
          std::fill(c.begin(), c.end(), kNaN);
          break;
        }
        // (A bad count's row has N NaN: S_k and so the gradient are NaN.)
        if (n == scalar_t(0) || !is_valid_count(n)) continue;
        if (held && is_exact_count(n)) {
          const scalar_t* e = ad.data() + (static_cast<int64_t>(n) - 1) * K;
          for (int64_t k = 0; k < K; ++k) {
            const double g = static_cast<double>(grad[r * K + k]);
            if (g != 0.0) c[k] += g * static_cast<double>(e[k]);
          }
          continue;
        }
        for (int64_t k = 0; k < K; ++k) {
          const double g = static_cast<double>(grad[r * K + k]);
          if (g != 0.0) c[k] += g * static_cast<double>(adpoch(cs[k].f, cs[k].a, n));
        }
      }
      for (int64_t k = 0; k < K; ++k) {
        grad_la[k * V + v] = static_cast<scalar_t>(
            c[k] - p.log_A[k].column_factor(cs[k].a, cs[k].log_a) * S[k]);
      }
    }
  });
}

}  // namespace

Tensor log_lik_csr_cpu(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize) {
  const CsrArgs<CpuDevice> a(crow, col, val, log_alpha);
  Tensor out = torch::stable::new_empty(a.log_alpha, csr_out_shape(a.B, a.log_alpha));
  if (a.B == 0 || a.K == 0) return out;
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    CsrAlpha<S> p(t.log_alpha, a.K, a.V);
    if (csr_forward_uses_table(a.nnz, a.V, a.K, sizeof(S))) p.fill_table();
    csr_forward(t.crow, t.col, t.val, a.B, a.nnz, p, normalize, t.out(out));
  });
  return out;
}

Tensor log_lik_csr_backward_cpu(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                Tensor csc_row, Tensor csc_val, Tensor log_alpha) {
  const CsrBackwardArgs<CpuDevice> a(grad, crow, val, csc_ptr, csc_row, csc_val, log_alpha);
  Tensor grad_la = torch::stable::new_zeros(a.log_alpha, a.log_alpha.sizes());
  if (a.K == 0 || a.V == 0) return grad_la;
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    const CsrAlpha<S> p(t.log_alpha, a.K, a.V);
    csr_backward(t.grad, t.crow, t.val, t.csc_ptr, t.csc_row, t.csc_val, a.B, a.nnz, p,
                 t.out(grad_la));
  });
  return grad_la;
}

}  // namespace cpu
}  // namespace dirmult
