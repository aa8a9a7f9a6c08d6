// dirmult::poch_terms on CUDA, and the CUDA registrations of all ops.
#include "cuda_utils.cuh"
#include "dirmult/math.h"
#include "ops_cuda.h"
#include "../common/safe_box.h"

namespace dirmult {
namespace cuda {

template <typename scalar_t>
__global__ void poch_terms_kernel(const scalar_t* __restrict__ log_alpha,
                                  const scalar_t* __restrict__ n, int64_t size,
                                  scalar_t* __restrict__ lnp, scalar_t* __restrict__ adp) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size) return;
  const scalar_t a = dm_exp(log_alpha[i]);
  lnp[i] = lnpoch(a, log_alpha[i], n[i]);
  adp[i] = adpoch(a, n[i]);
}

std::tuple<Tensor, Tensor> poch_terms_cuda(Tensor alpha, Tensor n) {
  STD_TORCH_CHECK(is_compute_dtype(alpha.scalar_type()) && n.scalar_type() == alpha.scalar_type(),
                  "dirmult: poch_terms takes float32/float64 log_alpha and n of one dtype");
  STD_TORCH_CHECK(alpha.numel() == n.numel(), "dirmult: poch_terms needs alpha and n of one size");
  check_same_device(alpha, "alpha", n, "n");
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

// Defined in log_lik_csr_cuda.cu.
Tensor log_lik_csr_cuda(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize);
Tensor log_lik_csr_backward_cuda(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                 Tensor csc_row, Tensor csc_val, Tensor log_alpha);

}  // namespace cuda
}  // namespace dirmult

STABLE_TORCH_LIBRARY_IMPL(dirmult, CUDA, m) {
  m.impl("log_lik", DM_BOX(&dirmult::cuda::log_lik_cuda));
  m.impl("log_lik_backward", DM_BOX(&dirmult::cuda::log_lik_backward_cuda));
  m.impl("log_lik_components", DM_BOX(&dirmult::cuda::log_lik_components_cuda));
  m.impl("log_lik_components_backward", DM_BOX(&dirmult::cuda::log_lik_components_backward_cuda));
  m.impl("log_lik_with_grad", DM_BOX(&dirmult::cuda::log_lik_with_grad_cuda));
  m.impl("poch_terms", DM_BOX(&dirmult::cuda::poch_terms_cuda));
  m.impl("log_lik_csr", DM_BOX(&dirmult::cuda::log_lik_csr_cuda));
  m.impl("log_lik_csr_backward", DM_BOX(&dirmult::cuda::log_lik_csr_backward_cuda));
}
