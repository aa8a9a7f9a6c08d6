// Host tensor helpers of the CUDA launchers.
#pragma once

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>

#include "../common/tensor_checks.h"

namespace dirmult {
namespace cuda {

using torch::headeronly::ScalarType;

// Row k of a (K, ...) tensor, a view (torch::stable::narrow takes a
// non-const handle, hence the copy of the handle).
inline Tensor row_view(Tensor t, int64_t k) { return torch::stable::narrow(t, 0, k, 1); }

// Contiguous counts in a dtype the kernels read natively (see
// DM_DISPATCH_NATIVE_COUNTS).
inline Tensor native_counts(const Tensor& counts) {
  switch (counts.scalar_type()) {
    case ScalarType::Int:
    case ScalarType::Long:
      return as_contiguous(torch::stable::to(counts, ScalarType::Double));
    case ScalarType::Half:
    case ScalarType::BFloat16:
      return as_contiguous(torch::stable::to(counts, ScalarType::Float));
    default:
      return as_contiguous(counts);
  }
}

// The Device of op_args.h's argument structs: the call's device selected
// for its lifetime, the counts as native_counts makes them.
struct CudaDevice {
  struct Guard {
    torch::stable::accelerator::DeviceGuard guard;
    explicit Guard(const Tensor& t) : guard(t.get_device_index()) {}
  };
  static Tensor counts(const Tensor& counts) { return native_counts(counts); }
};

}  // namespace cuda
}  // namespace dirmult
