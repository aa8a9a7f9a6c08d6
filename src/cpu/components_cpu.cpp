// CPU entry points of dirmult::log_lik_components (the (B, K) matrix of
// per-component log-likelihoods: a mixture's E-step, a classifier's scores)
// and its backward: component k is log_lik with log_alpha[k], by the
// shared-alpha kernels (components_cpu.h).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include "../common/tensor_checks.h"
#include "components_cpu.h"

namespace dirmult {

Tensor log_lik_components_cpu(Tensor counts, Tensor log_alpha, bool normalize) {
  check_components(counts, log_alpha);
  counts = as_contiguous(counts);
  log_alpha = as_contiguous(log_alpha);
  const int64_t B = counts.size(0), V = counts.size(1), K = log_alpha.size(0);
  // V = 0: every row is empty, log-likelihood 0.
  if (B * K == 0 || V == 0) return torch::stable::new_zeros(log_alpha, {B, K});
  Tensor out = torch::stable::new_empty(log_alpha, {B, K});  // every element written
  components_forward_cpu(counts, log_alpha, normalize, out);
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
  components_backward_cpu(grad, counts, log_alpha, grad_la);
  return grad_la;
}

}  // namespace dirmult
