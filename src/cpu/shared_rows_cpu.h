// The shared-alpha CPU kernels (log_lik_cpu.cpp) for one row of a (K, V)
// log_alpha, so that log_lik_components_cpu (components_cpu.cpp) scores
// component k with log_lik's own kernels: its lookup tables, vector math
// path, few-row column chunks and reproducible column sums, and its bits
// (component k is log_lik(counts, log_alpha[k]) exactly). It once scored
// each nonzero count against every component by the scalar math path: 10x
// slower than K log_lik calls, and slower than eager's formula.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>

namespace dirmult {

// out[:, k] = log_lik(counts, log_alpha[k], normalize). counts (B, V),
// log_alpha (K, V) and out (B, K) contiguous, out of log_alpha's dtype, V > 0.
void shared_rows_forward_cpu(const torch::stable::Tensor& counts,
                             const torch::stable::Tensor& log_alpha, int64_t k, bool normalize,
                             torch::stable::Tensor& out);

// grad_la[k] = the gradient of sum_b grad[b, k] log_lik(counts[b], log_alpha[k])
// with respect to log_alpha[k]. grad (B, K), counts (B, V), log_alpha and
// grad_la (K, V), contiguous; V > 0.
void shared_rows_backward_cpu(const torch::stable::Tensor& grad,
                              const torch::stable::Tensor& counts,
                              const torch::stable::Tensor& log_alpha, int64_t k,
                              torch::stable::Tensor& grad_la);

}  // namespace dirmult
