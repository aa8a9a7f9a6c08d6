// dirmult::log_lik_csr and dirmult::log_lik_csr_backward on CUDA: the
// launchers. Kernels in kernels/csr_*.cuh; See Note [CSR inputs] and Note
// [CSR gradient].
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <vector>

#include "../common/count_dispatch.h"
#include "../common/csr_checks.h"
#include "../common/csr_dispatch.h"
#include "kernels/ceil_div.cuh"
#include "launch.h"
#include "kernels/csr_alpha.cuh"
#include "kernels/csr_backward.cuh"
#include "kernels/csr_forward.cuh"

namespace dirmult {
namespace cuda {
namespace {

// The CSR entry points' device guard: log_alpha's device for the call.
struct CsrDeviceGuard {
  torch::stable::accelerator::DeviceGuard guard;
  explicit CsrDeviceGuard(const Tensor& log_alpha) : guard(log_alpha.get_device_index()) {}
};

// The prepared concentrations of one call: cols (V, K) and the totals A (K,).
struct CsrPrep {
  Tensor cols, A;
};

template <typename T>
CsrPrep prepare_alpha(const Tensor& log_alpha, int64_t K, int64_t V, cudaStream_t stream) {
  const int nblk = csr_prep_blocks(V);
  CsrPrep p;
  p.cols = torch::stable::new_empty(log_alpha, {std::max<int64_t>(V * K, 1) * 4});
  Tensor Apart = torch::stable::new_empty(log_alpha, {K * nblk}, ScalarType::Double);
  p.A = torch::stable::new_empty(log_alpha, {K}, ScalarType::Double);
  csr_alpha_prep_kernel<T><<<dim3(nblk, static_cast<unsigned>(K)), kCsrPrepThreads, 0, stream>>>(
      static_cast<const T*>(log_alpha.const_data_ptr()), V, static_cast<int>(K),
      static_cast<CsrColumn<T>*>(p.cols.mutable_data_ptr()),
      static_cast<double*>(Apart.mutable_data_ptr()));
  DM_CUDA_CHECK_LAUNCH();
  csr_alpha_totals_kernel<<<static_cast<unsigned>(ceil_div(K, 32)), 32, 0, stream>>>(
      static_cast<const double*>(Apart.const_data_ptr()), nblk, static_cast<int>(K),
      static_cast<double*>(p.A.mutable_data_ptr()));
  DM_CUDA_CHECK_LAUNCH();
  return p;
}

}  // namespace

Tensor log_lik_csr_cuda(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize) {
  const CsrArgs<CsrDeviceGuard> a(crow, col, val, log_alpha);
  const int64_t B = a.B, K = a.K, V = a.V;
  STD_TORCH_CHECK(K <= 65535, "dirmult: at most 65535 components with CSR counts on CUDA");
  Tensor out = torch::stable::new_empty(a.log_alpha, csr_out_shape(B, a.log_alpha));
  if (B == 0 || K == 0) return out;
  const cudaStream_t stream = current_stream(a.log_alpha.get_device_index());
  DM_DISPATCH_COMPUTE(a.log_alpha.scalar_type(), [&] {
    const CsrPrep p = prepare_alpha<scalar_t>(a.log_alpha, K, V, stream);
    DM_DISPATCH_CSR(a.crow.scalar_type(), a.val.scalar_type(), [&] {
      csr_forward_kernel<scalar_t, value_t, index_t>
          <<<static_cast<unsigned>(ceil_div(B, kCsrRowsPerBlock)), kCsrRowsPerBlock * 32, 0,
             stream>>>(static_cast<const index_t*>(a.crow.const_data_ptr()),
                       static_cast<const index_t*>(a.col.const_data_ptr()),
                       static_cast<const value_t*>(a.val.const_data_ptr()), B, a.nnz, V,
                       static_cast<int>(K),
                       static_cast<const CsrColumn<scalar_t>*>(p.cols.const_data_ptr()),
                       static_cast<const double*>(p.A.const_data_ptr()), normalize,
                       static_cast<scalar_t*>(out.mutable_data_ptr()));
      DM_CUDA_CHECK_LAUNCH();
    });
  });
  return out;
}

Tensor log_lik_csr_backward_cuda(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                 Tensor csc_row, Tensor csc_val, Tensor log_alpha) {
  const CsrBackwardArgs<CsrDeviceGuard> a(grad, crow, val, csc_ptr, csc_row, csc_val, log_alpha);
  const int64_t B = a.B, nnz = a.nnz, K = a.K, V = a.V;
  STD_TORCH_CHECK(K <= 65535, "dirmult: at most 65535 components with CSR counts on CUDA");
  Tensor grad_la = torch::stable::new_empty(a.log_alpha, a.log_alpha.sizes());
  if (K == 0 || V == 0) return grad_la;
  const cudaStream_t stream = current_stream(a.log_alpha.get_device_index());
  const int64_t warps = ceil_div(B, kCsrRowsPerWarp);
  Tensor part = torch::stable::new_empty(a.log_alpha, {std::max<int64_t>(warps * K, 1)},
                                         ScalarType::Double);
  Tensor S = torch::stable::new_empty(a.log_alpha, {K}, ScalarType::Double);
  DM_DISPATCH_COMPUTE(a.log_alpha.scalar_type(), [&] {
    const CsrPrep p = prepare_alpha<scalar_t>(a.log_alpha, K, V, stream);
    DM_DISPATCH_CSR(a.crow.scalar_type(), a.val.scalar_type(), [&] {
      const auto* g = static_cast<const scalar_t*>(a.grad.const_data_ptr());
      const auto* A = static_cast<const double*>(p.A.const_data_ptr());
      if (warps > 0) {
        csr_row_weights_kernel<scalar_t, value_t, index_t>
            <<<static_cast<unsigned>(ceil_div(warps, kCsrBackwardWarps)), kCsrBackwardWarps * 32,
               0, stream>>>(g, static_cast<const index_t*>(a.crow.const_data_ptr()),
                            static_cast<const value_t*>(a.val.const_data_ptr()), B, nnz,
                            static_cast<int>(K), A, warps,
                            static_cast<double*>(part.mutable_data_ptr()));
        DM_CUDA_CHECK_LAUNCH();
      }
      csr_sum_weights_kernel<<<static_cast<unsigned>(K), kCsrSumThreads, 0, stream>>>(
          static_cast<const double*>(part.const_data_ptr()), warps, static_cast<int>(K), A,
          static_cast<double*>(S.mutable_data_ptr()));
      DM_CUDA_CHECK_LAUNCH();
      csr_column_grad_kernel<scalar_t, value_t, index_t>
          <<<static_cast<unsigned>(ceil_div(V, kCsrBackwardWarps)), kCsrBackwardWarps * 32, 0,
             stream>>>(g, static_cast<const index_t*>(a.csc_ptr.const_data_ptr()),
                       static_cast<const index_t*>(a.csc_row.const_data_ptr()),
                       static_cast<const value_t*>(a.csc_val.const_data_ptr()), B, nnz, V,
                       static_cast<int>(K),
                       static_cast<const CsrColumn<scalar_t>*>(p.cols.const_data_ptr()),
                       static_cast<const double*>(S.const_data_ptr()),
                       static_cast<scalar_t*>(grad_la.mutable_data_ptr()));
      DM_CUDA_CHECK_LAUNCH();
    });
  });
  return grad_la;
}

}  // namespace cuda
}  // namespace dirmult
