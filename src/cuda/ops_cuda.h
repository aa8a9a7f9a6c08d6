// The CUDA entry points of the dirmult ops (registered in register_cuda.cu),
// and log_lik's shared-alpha forward, which log_lik_components reuses.
#pragma once

#include <cuda_runtime.h>

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "../common/tensor_checks.h"

namespace dirmult {
namespace cuda {

Tensor log_lik_cuda(Tensor counts, Tensor log_alpha, bool normalize);
std::tuple<Tensor, Tensor> log_lik_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha,
                                                 bool normalize, bool counts_grad);
Tensor log_lik_components_cuda(Tensor counts, Tensor log_alpha, bool normalize);
Tensor log_lik_components_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha);
std::tuple<Tensor, Tensor> log_lik_with_grad_cuda(Tensor counts, Tensor log_alpha, bool normalize);
std::tuple<Tensor, Tensor> poch_terms_cuda(Tensor alpha, Tensor n);
std::tuple<Tensor, Tensor> tpoch_terms_cuda(Tensor log_alpha, Tensor n);
Tensor log_lik_csr_cuda(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize);
Tensor log_lik_csr_backward_cuda(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                 Tensor csc_row, Tensor csc_val, Tensor log_alpha);
Tensor log_lik_regression_cuda(Tensor counts, Tensor X, Tensor W, std::optional<Tensor> bias,
                               bool normalize);
std::tuple<Tensor, Tensor, Tensor> log_lik_regression_backward_cuda(Tensor grad, Tensor counts,
                                                                    Tensor X, Tensor W,
                                                                    std::optional<Tensor> bias,
                                                                    bool normalize);

// log_lik of B rows of V native counts (contiguous) and shared float32
// log_alpha (V,) into out[0 .. B), on stream (log_lik_cuda.cu).
void log_lik_shared_float(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                          bool normalize, float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace dirmult
