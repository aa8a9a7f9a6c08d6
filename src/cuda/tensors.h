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

// Note [Wide integer counts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// float32 holds integers exactly only up to 2^24, so the float32 kernels
// would round an int32 or int64 count above it to a neighbour before its
// terms (one count is worth about log n nats there). The CPU kernels read
// integer counts natively and take such a count's terms in float64
// (row_sums_cpu.h, count_rounds); on CUDA, where integer counts are
// converted to float64 first (native_counts), a call with int32 or int64
// counts and float32 log_alpha runs the float64 kernels and rounds its
// results to float32 once. Whether a count is that large is not known on
// the host without a synchronization, so every such call takes float64.
inline bool wide_counts(const Tensor& counts, const Tensor& log_alpha) {
  const ScalarType t = counts.scalar_type();
  return (t == ScalarType::Int || t == ScalarType::Long) &&
         log_alpha.scalar_type() == ScalarType::Float;
}

inline Tensor to_float64(const Tensor& t) { return torch::stable::to(t, ScalarType::Double); }
inline Tensor to_float32(const Tensor& t) { return torch::stable::to(t, ScalarType::Float); }

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
