// dirmult::tpoch_terms on CPU (tpoch_terms_cpu.cpp), for the registration.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <tuple>

namespace dirmult {

std::tuple<torch::stable::Tensor, torch::stable::Tensor> tpoch_terms_cpu(
    torch::stable::Tensor log_alpha, torch::stable::Tensor n);

}  // namespace dirmult
