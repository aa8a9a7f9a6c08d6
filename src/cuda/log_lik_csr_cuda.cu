// dirmult::log_lik_csr and dirmult::log_lik_csr_backward on CUDA: the
// launchers. Kernels in kernels/csr_*.cuh; See Note [CSR inputs] and Note
// [CSR gradient].
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <vector>

#include "../common/op_args.h"
#include "kernels/ceil_div.cuh"
#include "launch.h"
#include "policy.h"
#include "tensors.h"
#include "kernels/csr_alpha.cuh"
#include "kernels/csr_backward.cuh"
#include "kernels/csr_forward.cuh"

namespace dirmult {
namespace cuda {
namespace {

// The prepared concentrations of one call: cols (V, K), the totals A (K,)
// and, when asked (Kt > 0), the forward's table (V, kCsrTableCounts, Kt).
struct CsrPrep {
  Tensor cols, log_A, table;  // log_A: (K,) float64 (See Note [Log-space totals])
};

template <typename T>
CsrPrep prepare_alpha(const Tensor& log_alpha, int64_t K, int64_t V, int64_t Kt,
                      cudaStream_t stream) {
  const bool with_table = Kt > 0;
  const int nblk = csr_prep_blocks(V);
  CsrPrep p;
  p.cols = torch::stable::new_empty(log_alpha, {std::max<int64_t>(V * K, 1) * 4});
  Tensor Apart = torch::stable::new_empty(log_alpha, {K * nblk}, ScalarType::Double);
  p.log_A = torch::stable::new_empty(log_alpha, {K}, ScalarType::Double);
  if (with_table) {
    p.table = torch::stable::new_empty(log_alpha, {std::max<int64_t>(V * Kt * kCsrTableCounts, 1)});
  }
  csr_alpha_prep_kernel<T><<<dim3(nblk, static_cast<unsigned>(K)), kCsrPrepThreads, 0, stream>>>(
      static_cast<const T*>(log_alpha.const_data_ptr()), V, static_cast<int>(K),
      static_cast<CsrColumn<T>*>(p.cols.mutable_data_ptr()),
      static_cast<double*>(Apart.mutable_data_ptr()));
  DM_CUDA_CHECK_LAUNCH();
  if (with_table && V * K > 0) {
    csr_table_fill_kernel<T>
        <<<static_cast<unsigned>(ceil_div(V * Kt * kCsrTableCounts, 256)), 256, 0, stream>>>(
            static_cast<const T*>(log_alpha.const_data_ptr()), V, static_cast<int>(K),
            static_cast<int>(Kt), static_cast<T*>(p.table.mutable_data_ptr()));
    DM_CUDA_CHECK_LAUNCH();
  }
  csr_alpha_totals_kernel<T><<<static_cast<unsigned>(ceil_div(K, 32)), 32, 0, stream>>>(
      static_cast<const double*>(Apart.const_data_ptr()), nblk, static_cast<int>(K),
      static_cast<const T*>(log_alpha.const_data_ptr()), V,
      static_cast<double*>(p.log_A.mutable_data_ptr()));
  DM_CUDA_CHECK_LAUNCH();
  return p;
}

}  // namespace

Tensor log_lik_csr_cuda(Tensor crow, Tensor col, Tensor val, Tensor log_alpha, bool normalize) {
  const CsrArgs<CudaDevice> a(crow, col, val, log_alpha);
  const int64_t B = a.B, nnz = a.nnz, K = a.K, V = a.V;
  STD_TORCH_CHECK(K <= 65535, "dirmult: at most 65535 components with CSR counts on CUDA");
  Tensor out = torch::stable::new_empty(a.log_alpha, csr_out_shape(B, a.log_alpha));
  if (B == 0 || K == 0) return out;
  const cudaStream_t stream = current_stream(a.log_alpha.get_device_index());
  a.dispatch([&](auto t) {
    using scalar_t = typename decltype(t)::scalar_t;
    using value_t = typename decltype(t)::value_t;
    using index_t = typename decltype(t)::index_t;
    const int64_t Kt = csr_table_stride(V, K, kCsrTableCounts, nnz, sizeof(scalar_t));
    const CsrPrep p = prepare_alpha<scalar_t>(a.log_alpha, K, V, Kt, stream);
    const auto* cols = static_cast<const CsrColumn<scalar_t>*>(p.cols.const_data_ptr());
    const auto* log_A = static_cast<const double*>(p.log_A.const_data_ptr());
    if (Kt > 0) {
      const bool short_rows = csr_forward_short_rows(B, nnz, kCsrRowsPerWarpShort);
      auto launch = [&](auto rows, auto walk) {
        constexpr int R = decltype(rows)::value, KW = decltype(walk)::value;
        csr_forward_table_kernel<scalar_t, value_t, index_t, R, KW>
            <<<static_cast<unsigned>(ceil_div(ceil_div(B, R), kCsrRowsPerBlock)),
               kCsrRowsPerBlock * 32, 0, stream>>>(
                t.crow, t.col, t.val, B, nnz, V, static_cast<int>(K), static_cast<int>(Kt),
                static_cast<const scalar_t*>(p.table.const_data_ptr()), cols, log_A, normalize,
                t.out(out));
      };
      using One = std::integral_constant<int, 1>;
      using Short = std::integral_constant<int, kCsrRowsPerWarpShort>;
      using Walk8 = std::integral_constant<int, 8>;
      using Walk16 = std::integral_constant<int, 16>;
      if (K == 1) {
        short_rows ? launch(Short{}, One{}) : launch(One{}, One{});
      } else if (csr_walk_components(K, short_rows) == 16) {
        launch(One{}, Walk16{});
      } else {
        short_rows ? launch(Short{}, Walk8{}) : launch(One{}, Walk8{});
      }
      DM_CUDA_CHECK_LAUNCH();
      return;
    }
    csr_forward_kernel<scalar_t, value_t, index_t>
        <<<static_cast<unsigned>(ceil_div(B, kCsrRowsPerBlock)), kCsrRowsPerBlock * 32, 0,
           stream>>>(t.crow, t.col, t.val, B, nnz, V, static_cast<int>(K), cols, log_A, normalize,
                     t.out(out));
    DM_CUDA_CHECK_LAUNCH();
  });
  return out;
}

Tensor log_lik_csr_backward_cuda(Tensor grad, Tensor crow, Tensor val, Tensor csc_ptr,
                                 Tensor csc_row, Tensor csc_val, Tensor log_alpha) {
  const CsrBackwardArgs<CudaDevice> a(grad, crow, val, csc_ptr, csc_row, csc_val, log_alpha);
  const int64_t B = a.B, nnz = a.nnz, K = a.K, V = a.V;
  STD_TORCH_CHECK(K <= 65535, "dirmult: at most 65535 components with CSR counts on CUDA");
  Tensor grad_la = torch::stable::new_empty(a.log_alpha, a.log_alpha.sizes());
  if (K == 0 || V == 0) return grad_la;
  const cudaStream_t stream = current_stream(a.log_alpha.get_device_index());
  const int64_t warps = ceil_div(B, kCsrRowsPerWarp);
  Tensor part = torch::stable::new_empty(a.log_alpha, {std::max<int64_t>(warps * K, 1)},
                                         ScalarType::Double);
  // S (K,), then log A_k where A_k is out of range, else NaN (csr_sum_weights_kernel).
  Tensor S = torch::stable::new_empty(a.log_alpha, {2 * K}, ScalarType::Double);
  a.dispatch([&](auto t) {
    using scalar_t = typename decltype(t)::scalar_t;
    using value_t = typename decltype(t)::value_t;
    using index_t = typename decltype(t)::index_t;
    const CsrPrep p = prepare_alpha<scalar_t>(a.log_alpha, K, V, 0, stream);
    const auto* log_A = static_cast<const double*>(p.log_A.const_data_ptr());
    if (warps > 0) {
      csr_row_weights_kernel<scalar_t, value_t, index_t>
          <<<static_cast<unsigned>(ceil_div(warps, kCsrBackwardWarps)), kCsrBackwardWarps * 32,
             0, stream>>>(t.grad, t.crow, t.val, B, nnz, static_cast<int>(K), log_A, warps,
                          static_cast<double*>(part.mutable_data_ptr()));
      DM_CUDA_CHECK_LAUNCH();
    }
    csr_sum_weights_kernel<scalar_t><<<static_cast<unsigned>(K), kCsrSumThreads, 0, stream>>>(
        static_cast<const double*>(part.const_data_ptr()), warps, static_cast<int>(K), log_A,
        static_cast<double*>(S.mutable_data_ptr()));
    DM_CUDA_CHECK_LAUNCH();
    csr_column_grad_kernel<scalar_t, value_t, index_t>
        <<<static_cast<unsigned>(ceil_div(V, kCsrBackwardWarps)), kCsrBackwardWarps * 32, 0,
           stream>>>(t.grad, t.csc_ptr, t.csc_row, t.csc_val, B, nnz, V, static_cast<int>(K),
                     static_cast<const CsrColumn<scalar_t>*>(p.cols.const_data_ptr()),
                     static_cast<const double*>(S.const_data_ptr()), t.out(grad_la));
    DM_CUDA_CHECK_LAUNCH();
  });
  return grad_la;
}

}  // namespace cuda
}  // namespace dirmult
