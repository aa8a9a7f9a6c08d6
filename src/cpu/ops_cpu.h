// The CPU entry points of the dirmult ops (schemas in src/schema.cpp),
// registered in register_cpu.cpp; each defined in the file named after it.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <tuple>

namespace dirmult {
namespace cpu {

using torch::stable::Tensor;

// log_lik_cpu.cpp
Tensor log_lik_cpu(Tensor counts, Tensor log_alpha, bool normalize);
// log_lik_backward_cpu.cpp
std::tuple<Tensor, Tensor> log_lik_backward_cpu(Tensor grad, Tensor counts, Tensor log_alpha,
                                                bool normalize, bool counts_grad);
// log_lik_with_grad_cpu.cpp
std::tuple<Tensor, Tensor> log_lik_with_grad_cpu(Tensor counts, Tensor log_alpha,
                                                 bool normalize);
// components_cpu.cpp
Tensor log_lik_components_cpu(Tensor counts, Tensor log_alpha, bool normalize);
Tensor log_lik_components_backward_cpu(Tensor grad, Tensor counts, Tensor log_alpha);
// poch_terms_cpu.cpp
std::tuple<Tensor, Tensor> poch_terms_cpu(Tensor log_alpha, Tensor n);
// tpoch_terms_cpu.cpp
std::tuple<Tensor, Tensor> tpoch_terms_cpu(Tensor log_alpha, Tensor n);
// log_lik_csr_cpu.cpp
Tensor log_lik_csr_cpu(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize);
Tensor log_lik_csr_backward_cpu(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                Tensor csc_row, Tensor csc_val, Tensor log_alpha);
// log_lik_csr_with_grad_cpu.cpp
std::tuple<Tensor, Tensor> log_lik_csr_with_grad_cpu(Tensor crow, Tensor col, Tensor val,
                                                     Tensor log_alpha, bool normalize);
// log_lik_regression_cpu.cpp
Tensor log_lik_regression_cpu(Tensor counts, Tensor X, Tensor W, std::optional<Tensor> bias,
                              bool normalize);
std::tuple<Tensor, Tensor, Tensor> log_lik_regression_backward_cpu(Tensor grad, Tensor counts,
                                                                   Tensor X, Tensor W,
                                                                   std::optional<Tensor> bias,
                                                                   bool normalize);

}  // namespace cpu
}  // namespace dirmult
