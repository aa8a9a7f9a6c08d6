// dirmult::log_lik_regression and its backward on CUDA (See Note
// [Regression fusion]): torch's matmuls around log_lik's per-sample kernels.
//
//   forward:  log_alpha = X W + bias (one matmul, a (B, V) tensor), then
//             log_lik_cuda
//   backward: log_lik_backward_cuda's (B, V) gradient G on that log_alpha,
//             then dX = G W^T, dW = X^T G and dbias = G's column sums
#include <torch/csrc/stable/ops.h>

#include <optional>
#include <tuple>
#include <vector>

#include "../common/op_args.h"
#include "ops_cuda.h"
#include "tensors.h"

namespace dirmult {
namespace cuda {
namespace {

using Args = RegressionArgs<CudaDevice>;

// log_alpha (B, V) = X W + bias as one matmul: the bias as a last row of W
// against a column of ones appended to X (the stable ABI of every supported
// torch has matmul, pad and narrow; a dispatcher call of aten::linear is
// not in torch 2.11's headers).
Tensor design_log_alpha(const Args& a) {
  if (!a.bias.has_value()) return torch::stable::matmul(a.X, a.W);
  const Tensor X1 = torch::stable::pad(a.X, {0, 1}, "constant", 1.0);
  Tensor W1 = torch::stable::pad(a.W, {0, 0, 0, 1});
  Tensor last = torch::stable::narrow(W1, 0, a.P, 1);
  torch::stable::copy_(last, torch::stable::reshape(*a.bias, {1, a.V}));
  return torch::stable::matmul(X1, W1);
}

}  // namespace

Tensor log_lik_regression_cuda(Tensor counts, Tensor X, Tensor W, std::optional<Tensor> bias,
                               bool normalize) {
  const Args a(counts, X, W, bias);
  if (a.empty()) return torch::stable::new_zeros(a.X, {a.B});
  return log_lik_cuda(a.counts, design_log_alpha(a), normalize);
}

std::tuple<Tensor, Tensor, Tensor> log_lik_regression_backward_cuda(Tensor grad, Tensor counts,
                                                                    Tensor X, Tensor W,
                                                                    std::optional<Tensor> bias,
                                                                    bool normalize) {
  // (normalize adds a term free of log_alpha: the gradient is the same.)
  const Args a(grad, counts, X, W, bias);
  if (a.empty()) {
    return {torch::stable::new_zeros(a.X, {a.B, a.P}), torch::stable::new_zeros(a.X, {a.P, a.V}),
            torch::stable::new_zeros(a.X, {a.bias.has_value() ? a.V : 0})};
  }
  const Tensor G =
      std::get<0>(log_lik_backward_cuda(*a.grad, a.counts, design_log_alpha(a), normalize, false));
  Tensor dX = torch::stable::matmul(G, torch::stable::transpose(a.W, 0, 1));
  Tensor dW = torch::stable::matmul(torch::stable::transpose(a.X, 0, 1), G);
  Tensor dbias = a.bias.has_value() ? torch::stable::sum(G, std::vector<int64_t>{0})
                                    : torch::stable::new_zeros(a.X, {0});
  return {dX, dW, dbias};
}

}  // namespace cuda
}  // namespace dirmult
