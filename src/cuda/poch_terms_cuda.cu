// dirmult::poch_terms on CUDA: lnpoch and adpoch of each (log_alpha, n) pair.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "kernels/ceil_div.cuh"
#include "kernels/poch_terms.cuh"
#include "launch.h"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {

std::tuple<Tensor, Tensor> poch_terms_cuda(Tensor alpha, Tensor n) {
  STD_TORCH_CHECK(is_compute_dtype(alpha.scalar_type()) && n.scalar_type() == alpha.scalar_type(),
                  "dirmult: poch_terms takes float32/float64 log_alpha and n of one dtype");
  STD_TORCH_CHECK(alpha.numel() == n.numel(), "dirmult: poch_terms needs log_alpha and n of one size");
  check_same_device(alpha, "log_alpha", n, "n");
  torch::stable::accelerator::DeviceGuard guard(alpha.get_device_index());
  alpha = as_contiguous(alpha);
  n = as_contiguous(n);
  Tensor lnp = torch::stable::empty_like(alpha);
  Tensor adp = torch::stable::empty_like(alpha);
  const int64_t size = alpha.numel();
  if (size == 0) return {lnp, adp};
  const cudaStream_t stream = current_stream(alpha.get_device_index());
  DM_DISPATCH_COMPUTE(alpha.scalar_type(), [&] {
    poch_terms_kernel<scalar_t><<<ceil_div(size, 256), 256, 0, stream>>>(
        static_cast<const scalar_t*>(alpha.const_data_ptr()),
        static_cast<const scalar_t*>(n.const_data_ptr()), size,
        static_cast<scalar_t*>(lnp.mutable_data_ptr()), static_cast<scalar_t*>(adp.mutable_data_ptr()));
    DM_CUDA_CHECK_LAUNCH();
  });
  return {lnp, adp};
}

}  // namespace cuda
}  // namespace dirmult
