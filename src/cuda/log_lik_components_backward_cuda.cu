// dirmult::log_lik_components_backward on CUDA: the gradient with respect to
// the (K, V) log_alpha of sum_b,k grad[b, k] log_lik(counts[b], log_alpha[k]).
//
//   log_lik_components_backward_cuda -> launch_components_backward, the way
//   picked by policy.h: K log_lik backwards (launch_backward_shared, See Note
//   [Per component]) | components_table_backward_kernel + row_count_totals_kernel
//   (float32, from kComponentBackwardTableMinRows rows) | column_backward_kernel
//   (math path); then the column finish (launch_column_backward.cuh).
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "components_table_launch.cuh"
#include "kernels/components_table.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "launch_column_backward.cuh"
#include "ops_cuda.h"
#include "policy.h"
#include "scratch.h"
#include "tensors.h"

namespace dirmult {
namespace cuda {
namespace {

constexpr int kComponentBlockBwd = 4;  // components per pass, math path

// grad_la (K, V) for K float32 components over many rows, with the
// component tables: the table kernel's column partials, the row totals, then
// the same finish as launch_backward_columns.
template <typename count_t, int KB>
void launch_components_backward_table(const Tensor& grad, const Tensor& counts,
                                      const Tensor& log_alpha, int64_t B, int64_t V, int K,
                                      float* grad_la, cudaStream_t stream) {
  ScratchLayout layout;
  const ComponentTableLaunch<TableKind::kAlphaDPoch, KB> shape(
      layout, B, V, K,
      one_wave_blocks<components_table_backward_kernel<count_t, KB>>(kCompThreads,
                                                                     kCompTableBytes),
      64);
  const int64_t row_tiles = shape.row_groups;
  const int64_t c_at = layout.add(row_tiles * K * V * static_cast<int64_t>(sizeof(double)));
  const int64_t n_at = layout.add(B * static_cast<int64_t>(sizeof(double)));
  const int64_t w_at = layout.add(weight_partial_bytes(B, K, 1));
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<float> pa = shape.tables.prepare(ws, log_alpha, false, stream);
  const float* table = shape.tables.table(ws);
  auto* Cpart = ScratchLayout::at<double>(ws, c_at);
  auto* N = ScratchLayout::at<double>(ws, n_at);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* g = static_cast<const float*>(grad.const_data_ptr());
  components_table_backward_kernel<count_t, KB><<<shape.grid(), kCompThreads, kCompTableBytes,
                                                  stream>>>(
      g, n, pa.cols, table, B, V, K, shape.rows_per_group, Cpart);
  DM_CUDA_CHECK_LAUNCH();
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  row_count_totals_kernel<count_t><<<ceil_div(B, 8), 256, 0, stream>>>(n, B, V, aligned, N);
  DM_CUDA_CHECK_LAUNCH();
  launch_column_finish<float>(g, N, 1, Cpart, row_tiles, pa, B, V, K,
                              ScratchLayout::at<double>(ws, w_at), grad_la, stream);
}

template <typename scalar_t, typename count_t>
void launch_components_backward(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                                int64_t B, int64_t V, int K, scalar_t* grad_la,
                                cudaStream_t stream) {
  if constexpr (use_tables<scalar_t>()) {
    if (components_per_component_backward(B, V, K)) {
      // log_lik's shared-alpha backward per component, each with its column
      // of grad: row k of grad's (K, B) transpose. Row k of grad_la is then
      // log_lik's gradient for log_alpha[k] bit for bit.
      const Tensor grad_by_component =
          torch::stable::contiguous(torch::stable::transpose(grad, 0, 1));
      for (int k = 0; k < K; ++k) {
        launch_backward_shared<float, count_t>(row_view(grad_by_component, k),
                                               counts, row_view(log_alpha, k),
                                               B, V, grad_la + k * V, stream);
      }
      return;
    }
    if (B >= kComponentBackwardTableMinRows) {
      with_component_block(K, [&](auto kb) {
        launch_components_backward_table<count_t, decltype(kb)::value>(grad, counts, log_alpha, B,
                                                                       V, K, grad_la, stream);
      });
      return;
    }
  }
  launch_backward_columns<scalar_t, count_t, kComponentBlockBwd, false>(grad, counts, log_alpha, B,
                                                                       V, K, grad_la, stream);
}

}  // namespace

Tensor log_lik_components_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha) {
  check_components_backward(grad, counts, log_alpha);
  if (wide_counts(counts, log_alpha)) {  // See Note [Wide integer counts]
    return to_float32(
        log_lik_components_backward_cuda(to_float64(grad), counts, to_float64(log_alpha)));
  }
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = as_contiguous(log_alpha);
  grad = as_contiguous(grad);
  const int64_t B = counts.size(0), V = counts.size(1);
  const int K = static_cast<int>(log_alpha.size(0));
  if (B == 0 || V == 0 || K == 0) return torch::stable::new_zeros(log_alpha, log_alpha.sizes());
  Tensor grad_la = torch::stable::new_empty(log_alpha, log_alpha.sizes());  // every entry written
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* gla = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      launch_components_backward<scalar_t, count_t>(grad, counts, log_alpha, B, V, K, gla, stream);
    });
  });
  return grad_la;
}

}  // namespace cuda
}  // namespace dirmult
