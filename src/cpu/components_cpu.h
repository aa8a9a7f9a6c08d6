// log_lik_components on CPU by the shared-alpha kernels (log_lik_cpu.cpp):
// component k is log_lik(counts, log_alpha[k]) exactly, with its lookup
// tables, vector math path, few-row column chunks and reproducible column
// sums; the table plan, which depends on the counts only, is made once for
// all K. (The op once scored each nonzero count against every component by
// the scalar math path: 10x slower than K log_lik calls, and slower than
// eager's formula.) components_cpu.cpp holds the op entry points.
#pragma once

#include <torch/csrc/stable/tensor.h>

namespace dirmult {

// out (B, K) = log_lik(counts, log_alpha[k], normalize) for every k.
// counts (B, V), log_alpha (K, V) and out contiguous, out of log_alpha's
// dtype, B, K, V > 0.
void components_forward_cpu(const torch::stable::Tensor& counts,
                            const torch::stable::Tensor& log_alpha, bool normalize,
                            torch::stable::Tensor& out);

// grad_la (K, V): row k is the gradient of sum_b grad[b, k]
// log_lik(counts[b], log_alpha[k]) with respect to log_alpha[k]. grad (B, K),
// counts (B, V), log_alpha and grad_la contiguous; B, K, V > 0.
void components_backward_cpu(const torch::stable::Tensor& grad,
                             const torch::stable::Tensor& counts,
                             const torch::stable::Tensor& log_alpha,
                             torch::stable::Tensor& grad_la);

}  // namespace dirmult
