// dirmult::tpoch_terms on CUDA: the elementwise second-derivative terms
// (a2tpoch, dadpoch) of include/dirmult/math.h. See Note [Trigamma terms].
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "kernels/ceil_div.cuh"
#include "kernels/tpoch_terms.cuh"
#include "launch.h"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {

std::tuple<Tensor, Tensor> tpoch_terms_cuda(Tensor log_alpha, Tensor n) {
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()) &&
                      n.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: tpoch_terms takes float32/float64 log_alpha and n of one dtype");
  STD_TORCH_CHECK(log_alpha.numel() == n.numel(),
                  "dirmult: tpoch_terms needs log_alpha and n of one size");
  check_same_device(log_alpha, "log_alpha", n, "n");
  torch::stable::accelerator::DeviceGuard guard(log_alpha.get_device_index());
  log_alpha = as_contiguous(log_alpha);
  n = as_contiguous(n);
  Tensor a2t = torch::stable::empty_like(log_alpha);
  Tensor dad = torch::stable::empty_like(log_alpha);
  const int64_t size = log_alpha.numel();
  if (size == 0) return {a2t, dad};
  const cudaStream_t stream = current_stream(log_alpha.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    tpoch_terms_kernel<scalar_t><<<ceil_div(size, 256), 256, 0, stream>>>(
        static_cast<const scalar_t*>(log_alpha.const_data_ptr()),
        static_cast<const scalar_t*>(n.const_data_ptr()), size,
        static_cast<scalar_t*>(a2t.mutable_data_ptr()),
        static_cast<scalar_t*>(dad.mutable_data_ptr()));
    DM_CUDA_CHECK_LAUNCH();
  });
  return {a2t, dad};
}

}  // namespace cuda
}  // namespace dirmult
