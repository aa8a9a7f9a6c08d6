// dirmult::log_lik_with_grad, shared by the CPU and CUDA implementations: its
// argument check, and the op as a forward plus a backward with unit row
// weights, for where no single-pass kernel applies.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <tuple>

#include "tensor_checks.h"

namespace dirmult {

// Returns true (log_alpha is shared), as check_log_alpha does.
inline bool check_log_lik_with_grad(const Tensor& counts, const Tensor& log_alpha) {
  const bool shared = check_log_alpha(counts, log_alpha);
  STD_TORCH_CHECK(shared,
                  "dirmult: log_lik_with_grad takes log_alpha of shape (V,), shared by all "
                  "rows; per-sample log_alpha of counts' shape has no single-pass gradient");
  return shared;
}

// forward(counts, log_alpha, normalize) -> Tensor and backward(grad, counts,
// log_alpha, normalize, counts_grad) -> (grad_la, grad_counts): the op's
// kernels for one device.
template <typename Forward, typename Backward>
std::tuple<Tensor, Tensor> log_lik_with_grad_from_ops(Forward forward, Backward backward,
                                                      const Tensor& counts,
                                                      const Tensor& log_alpha, bool normalize) {
  Tensor out = forward(counts, log_alpha, normalize);
  Tensor ones = torch::stable::new_empty(log_alpha, batch_shape(counts));
  torch::stable::fill_(ones, 1.0);
  return {out, std::get<0>(backward(ones, counts, log_alpha, normalize, false))};
}

}  // namespace dirmult
