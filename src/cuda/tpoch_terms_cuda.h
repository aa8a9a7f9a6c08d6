// dirmult::tpoch_terms on CUDA (tpoch_terms_cuda.cu), for the registration.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <tuple>

namespace dirmult {
namespace cuda {

std::tuple<torch::stable::Tensor, torch::stable::Tensor> tpoch_terms_cuda(
    torch::stable::Tensor log_alpha, torch::stable::Tensor n);

}  // namespace cuda
}  // namespace dirmult
