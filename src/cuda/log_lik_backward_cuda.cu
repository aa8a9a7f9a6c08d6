// dirmult::log_lik_backward on CUDA: the gradients of log_lik with respect to
// log_alpha and (counts_grad) the counts.
//
//   log_lik_backward_cuda
//     shared alpha:  launch_backward_columns (launch_column_backward.cuh:
//                    column_backward_kernel, row_weights_kernel,
//                    column_finish_kernel), and for the counts gradient
//                    alpha_prep_kernel + launch_backward_elementwise
//     per-sample float32, no counts gradient: launch_backward_per_sample_float
//     else:          launch_backward_elementwise (row_totals_kernel,
//                    elementwise_backward_kernel)
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include <type_traits>
#include <vector>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "kernels/elementwise_backward.cuh"
#include "kernels/per_sample_backward.cuh"
#include "kernels/row_chunks.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "launch_column_backward.cuh"
#include "ops_cuda.h"
#include "policy.h"
#include "prepare_alpha.cuh"
#include "scratch.h"
#include "tensors.h"

namespace dirmult {
namespace cuda {
namespace {

template <typename scalar_t, typename count_t>
void launch_backward_elementwise(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                                 const double* Apart, int nblk, bool per_sample, int64_t B,
                                 int64_t V, bool normalize, scalar_t* grad_la,
                                 scalar_t* grad_counts, cudaStream_t stream) {
  Tensor ws = workspace(counts, B * static_cast<int64_t>(sizeof(RowTotals)));
  auto* totals = static_cast<RowTotals*>(ws.mutable_data_ptr());
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
  row_totals_kernel<scalar_t, count_t><<<ceil_div(B, 8), 256, 0, stream>>>(
      n, la, Apart, nblk, per_sample, B, V, normalize, totals);
  DM_CUDA_CHECK_LAUNCH();
  const int64_t blocks = std::min<int64_t>(ceil_div(B * V, 256), 65536);
  elementwise_backward_kernel<scalar_t, count_t><<<blocks, 256, 0, stream>>>(
      static_cast<const scalar_t*>(grad.const_data_ptr()), n, la, per_sample, totals, B, V,
      normalize, grad_la, grad_counts);
  DM_CUDA_CHECK_LAUNCH();
}

// Per-sample float32 alpha, no counts gradient: a warp per (row, chunk) for
// the gradient, after a warp per (row, chunk) for the pieces of the row
// totals where rows are split (one chunk per row: the gradient kernel sums
// its row's totals itself).
template <typename count_t>
void launch_backward_per_sample_float(const Tensor& grad, const Tensor& counts,
                                      const Tensor& log_alpha, int64_t B, int64_t V,
                                      bool normalize, float* grad_la, cudaStream_t stream) {
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* la = static_cast<const float*>(log_alpha.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n) && is_aligned<float>(la) &&
                       is_aligned<float>(grad_la);
  const RowSplit split = split_rows(B, V);
  const int64_t blocks = ceil_div(B * split.num_chunks, kRowWarps);
  Tensor ws;
  PerSampleSums* sums = nullptr;
  if (split.num_chunks > 1) {
    ws = workspace(counts, B * split.num_chunks * static_cast<int64_t>(sizeof(PerSampleSums)));
    sums = static_cast<PerSampleSums*>(ws.mutable_data_ptr());
    per_sample_chunk_sums_kernel<count_t><<<blocks, kRowWarps * 32, 0, stream>>>(
        n, la, B, V, split, aligned, sums);
    DM_CUDA_CHECK_LAUNCH();
  }
  per_sample_grad_kernel<count_t><<<blocks, kRowWarps * 32, 0, stream>>>(
      static_cast<const float*>(grad.const_data_ptr()), n, la, sums, B, V, split, aligned,
      normalize, grad_la);
  DM_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::tuple<Tensor, Tensor> log_lik_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha,
                                                 bool normalize, bool counts_grad) {
  const bool shared = check_log_lik_backward(grad, counts, log_alpha);
  if (wide_counts(counts, log_alpha)) {  // See Note [Wide integer counts]
    auto [gla, gc] = log_lik_backward_cuda(to_float64(grad), counts, to_float64(log_alpha),
                                           normalize, counts_grad);
    return {to_float32(gla), to_float32(gc)};
  }
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = as_contiguous(log_alpha);
  grad = as_contiguous(grad);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  const std::vector<int64_t> grad_counts_shape = counts_grad_shape(counts, counts_grad);
  if (B == 0 || V == 0) {
    return {torch::stable::new_zeros(log_alpha, log_alpha.sizes()),
            torch::stable::new_zeros(log_alpha, grad_counts_shape)};
  }
  // The kernels write every element of both.
  Tensor grad_la = torch::stable::new_empty(log_alpha, log_alpha.sizes());
  Tensor grad_counts = torch::stable::new_empty(log_alpha, grad_counts_shape);
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* gla = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
    auto* gc = counts_grad ? static_cast<scalar_t*>(grad_counts.mutable_data_ptr()) : nullptr;
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      if (std::is_same_v<scalar_t, float> && !shared && gc == nullptr) {
        // (the cast: this branch is compiled, never taken, for float64 too)
        launch_backward_per_sample_float<count_t>(grad, counts, log_alpha, B, V, normalize,
                                                  reinterpret_cast<float*>(gla), stream);
        return;
      }
      if (!shared) {
        launch_backward_elementwise<scalar_t, count_t>(grad, counts, log_alpha, nullptr, 0, true,
                                                       B, V, normalize, gla, gc, stream);
        return;
      }
      launch_backward_shared<scalar_t, count_t>(grad, counts, log_alpha, B, V, gla, stream);
      if (gc != nullptr) {
        // The counts gradient needs only the concentration totals.
        const Tensor ws = workspace(counts, prepared_alpha_bytes<scalar_t>(1, V));
        const PreparedAlpha<scalar_t> pa =
            prepare_alpha<scalar_t>(log_alpha, 1, V, ws.mutable_data_ptr(), stream);
        launch_backward_elementwise<scalar_t, count_t>(grad, counts, log_alpha, pa.Apart, pa.nblk,
                                                       false, B, V, normalize, nullptr, gc, stream);
      }
    });
  });
  return {grad_la, grad_counts};
}

}  // namespace cuda
}  // namespace dirmult
