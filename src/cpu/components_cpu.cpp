// dirmult::log_lik_components on CPU (the (B, K) matrix of per-component
// log-likelihoods: a mixture's E-step, a classifier's scores) and its
// backward, by log_lik's shared-alpha kernels: component k is
// log_lik(counts, log_alpha[k]) exactly, with its lookup tables, vector
// math path, few-row column chunks and reproducible column sums. The table
// plan depends on the counts only: it is made once for all K.
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <vector>

#include "../common/op_args.h"
#include "log_lik_backward_cpu.h"
#include "log_lik_cpu.h"
#include "ops_cpu.h"
#include "tables_cpu.h"

namespace dirmult {
namespace cpu {
namespace {

// out (B, K) = log_lik(counts, la[k], normalize) for every k.
template <typename scalar_t, typename count_t>
void components_forward(const count_t* n, const scalar_t* la, int64_t B, int64_t V, int64_t K,
                        bool normalize, scalar_t* o) {
  const TablePlan plan = forward_plan<scalar_t, count_t>(n, B, V);  // (once for all K)
  for (int64_t k = 0; k < K; ++k) {
    forward_shared<scalar_t, count_t>(n, la + k * V, B, V, normalize, plan, o + k, K);
  }
}

// gla (K, V): row k is the gradient of sum_b g[b, k] log_lik(counts[b],
// la[k]) with respect to la[k].
template <typename scalar_t, typename count_t>
void components_backward(const scalar_t* g, const count_t* n, const scalar_t* la, int64_t B,
                         int64_t V, int64_t K, scalar_t* gla) {
  const TablePlan plan = backward_plan<scalar_t, count_t>(n, B, V);  // (once for all K)
  std::vector<scalar_t> gk(B);  // component k's row weights, contiguous
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t b = 0; b < B; ++b) gk[b] = g[b * K + k];
    backward_shared<scalar_t, count_t>(gk.data(), n, la + k * V, B, V, gla + k * V, {}, &plan);
  }
}

}  // namespace

Tensor log_lik_components_cpu(Tensor counts, Tensor log_alpha, bool normalize) {
  const ComponentsArgs<CpuDevice> a(counts, log_alpha);
  // V = 0: every row is empty, log-likelihood 0.
  if (a.empty()) return torch::stable::new_zeros(a.log_alpha, {a.B, a.K});
  Tensor out = torch::stable::new_empty(a.log_alpha, {a.B, a.K});  // every element written
  a.dispatch([&](auto t) {
    components_forward(t.counts, t.log_alpha, a.B, a.V, a.K, normalize, t.out(out));
  });
  return out;
}

Tensor log_lik_components_backward_cpu(Tensor grad, Tensor counts, Tensor log_alpha) {
  const ComponentsBackwardArgs<CpuDevice> a(grad, counts, log_alpha);
  Tensor grad_la = torch::stable::new_zeros(a.log_alpha, a.log_alpha.sizes());
  if (a.empty()) return grad_la;
  a.dispatch([&](auto t) {
    components_backward(t.grad, t.counts, t.log_alpha, a.B, a.V, a.K, t.out(grad_la));
  });
  return grad_la;
}

}  // namespace cpu
}  // namespace dirmult
