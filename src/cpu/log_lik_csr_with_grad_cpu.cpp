// CPU kernel of dirmult::log_lik_csr_with_grad: the single pass for CSR
// counts (See Note [Single pass]): one read of the rows gives each row's
// log-likelihood and the gradient of their sum with respect to a shared
// log_alpha (V,), without the column-sorted copy the backward op reads.
//
// Rows go in fixed blocks; a block sums adpoch(a_c, n) of its nonzeros into
// its own column accumulators, and the blocks' accumulators are added in
// block order: the same bits for any thread count (Note [Determinism]).
// The row terms dpoch(A, N) are summed by kCsrRowBlock rows, as the backward
// op sums them.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "../common/op_args.h"
#include "csr_alpha_cpu.h"
#include "ops_cpu.h"
#include "policy_cpu.h"
#include "tables_cpu.h"
#include "dirmult/math.h"

namespace dirmult {
namespace cpu {
namespace {

using namespace csr;

// adpoch(a_c, n), n = 1 .. kMaxExactCount, of every column, laid out (V, n).
template <typename T>
std::vector<T> adpoch_entries(const CsrAlpha<T>& p) {
  std::vector<T> ad(static_cast<size_t>(p.V * kMaxExactCount));
  torch::stable::parallel_for(0, p.V, parallel_grain(kMaxExactCount * 8, 64),
                              [&](int64_t v0, int64_t v1) {
    for (int64_t v = v0; v < v1; ++v) adpoch_entries(p.cols[v], ad.data() + v * kMaxExactCount, 1);
  });
  return ad;
}

template <typename scalar_t, typename value_t, typename index_t>
void csr_with_grad(const index_t* crow, const index_t* col, const value_t* val, int64_t B,
                   int64_t nnz, const CsrAlpha<scalar_t>& p, bool normalize, scalar_t* out,
                   scalar_t* grad) {
  const int64_t V = p.V;
  const bool tables = !p.table.empty();
  const std::vector<scalar_t> ad = tables ? adpoch_entries(p) : std::vector<scalar_t>();
  const auto& log_fact = small_log_factorials<scalar_t>();
  const LogTotal& A = p.log_A[0];
  // Row blocks: whole kCsrRowBlock sub-blocks, at most kCsrGradBlocks of
  // them, so that the accumulators take at most kCsrGradBlocks x V doubles.
  const int64_t subs = (B + kCsrRowBlock - 1) / kCsrRowBlock;
  const int64_t subs_per_block = (subs + kCsrGradBlocks - 1) / kCsrGradBlocks;
  const int64_t blocks = (subs + subs_per_block - 1) / subs_per_block;
  std::vector<double> acc(static_cast<size_t>(blocks * V), 0.0);
  std::vector<double> part(static_cast<size_t>(subs), 0.0);
  const int64_t grain = parallel_grain(subs_per_block * kCsrRowBlock * csr_row_work(nnz, B, 1));
  torch::stable::parallel_for(0, blocks, grain, [&](int64_t k0, int64_t k1) {
    for (int64_t blk = k0; blk < k1; ++blk) {
      double* a = acc.data() + blk * V;
      const int64_t b_end = std::min(B, (blk + 1) * subs_per_block * kCsrRowBlock);
      for (int64_t b = blk * subs_per_block * kCsrRowBlock; b < b_end; ++b) {
        int64_t j0, j1;
        bool ok = row_range(crow, b, nnz, j0, j1);
        double s = 0.0, N = ok ? 0.0 : kNaN;
        if (!ok) j1 = j0;  // (offsets outside the nonzeros: nothing is read)
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t c = static_cast<int64_t>(col[j]);
          const scalar_t n = static_cast<scalar_t>(val[j]);
          if (!is_valid_count(n)) {  // the row is NaN, and so (through N) the gradient
            ok = false;
            N = kNaN;
            break;
          }
          if (c < 0 || c >= V) {  // the row is NaN; no column to add to
            ok = false;
            N += static_cast<double>(val[j]);
            continue;
          }
          if (n == scalar_t(0)) continue;
          N += static_cast<double>(val[j]);
          if (tables && is_exact_count(n)) {
            const int ni = static_cast<int>(n);
            s += static_cast<double>(p.entries(c, ni)[0]);
            if (normalize) s -= static_cast<double>(log_fact[ni]);
            a[c] += static_cast<double>(ad[c * kMaxExactCount + (ni - 1)]);
            continue;
          }
          const CsrColumn<scalar_t>& cs = p.cols[c];
          s += static_cast<double>(lnpoch(cs.f, cs.a, cs.log_a, n));
          if (normalize) s -= static_cast<double>(log_factorial(n));
          a[c] += static_cast<double>(adpoch(cs.f, cs.a, n));
        }
        out[b] = static_cast<scalar_t>(ok && p.finite[0] ? s + csr_row_term(A, N, normalize)
                                                         : kNaN);
        part[b / kCsrRowBlock] += N == N ? A.row_weight(N) : kNaN;
      }
    }
  });
  double S = 0.0;
  for (int64_t i = 0; i < subs; ++i) S += part[i];
  if (!p.finite[0]) S = kNaN;
  torch::stable::parallel_for(0, V, parallel_grain(blocks, 1024), [&](int64_t v0, int64_t v1) {
    for (int64_t v = v0; v < v1; ++v) {
      double c = 0.0;
      for (int64_t blk = 0; blk < blocks; ++blk) c += acc[blk * V + v];
      grad[v] = static_cast<scalar_t>(c - A.column_factor(p.cols[v].a, p.cols[v].log_a) * S);
    }
  });
}

}  // namespace

std::tuple<Tensor, Tensor> log_lik_csr_with_grad_cpu(Tensor crow, Tensor col, Tensor val,
                                                     Tensor log_alpha, bool normalize) {
  const CsrArgs<CpuDevice> a(crow, col, val, log_alpha, check_csr_with_grad_parts);
  Tensor out = torch::stable::new_empty(a.log_alpha, {a.B});
  Tensor grad = torch::stable::new_zeros(a.log_alpha, a.log_alpha.sizes());
  if (a.B == 0 || a.V == 0) return {out, grad};
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    CsrAlpha<S> p(t.log_alpha, 1, a.V);
    if (csr_forward_uses_table(a.nnz, a.V, 1, sizeof(S))) p.fill_table();
    csr_with_grad(t.crow, t.col, t.val, a.B, a.nnz, p, normalize, t.out(out), t.out(grad));
  });
  return {out, grad};
}

}  // namespace cpu
}  // namespace dirmult
