// dirmult::log_lik_components on CUDA: out[b, k] = log_lik(counts[b],
// log_alpha[k]) for K mixture components.
//
//   log_lik_components_cuda -> launch_forward_components, the way picked by
//   policy.h: K log_lik calls (launch_components_as_shared, See Note [Per
//   component]) | components_table_forward_kernel + components_finish_kernel
//   (float32) | forward_rows_kernel<..., kComponentBlock> (float64).
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "components_table_launch.cuh"
#include "kernels/components_table.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "launch_forward_rows.cuh"
#include "ops_cuda.h"
#include "policy.h"
#include "scratch.h"
#include "tensors.h"

namespace dirmult {
namespace cuda {
namespace {

constexpr int kComponentBlock = 8;  // components per pass over a row, math path

// K float32 components over many rows: the component lookup-table kernel,
// then the per-(row, component) finish.
template <typename count_t, int KB>
void launch_components_table(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                             int K, bool normalize, float* out, cudaStream_t stream) {
  ScratchLayout layout;
  const ComponentTableLaunch<TableKind::kLogPoch, KB> shape(
      layout, B, V, K,
      one_wave_blocks<components_table_forward_kernel<count_t, KB>>(kCompThreads, kCompTableBytes),
      kCompWarps);
  const int64_t slices = shape.slices;
  const int64_t s_at = layout.add(B * slices * K * static_cast<int64_t>(sizeof(float)));
  const int64_t n_at = layout.add(B * slices * static_cast<int64_t>(sizeof(double2)));
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<float> pa = shape.tables.prepare(ws, log_alpha, normalize, stream);
  const float* table = shape.tables.table(ws);
  auto* Spart = ScratchLayout::at<float>(ws, s_at);
  auto* Npart = ScratchLayout::at<double2>(ws, n_at);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  components_table_forward_kernel<count_t, KB><<<shape.grid(), kCompThreads, kCompTableBytes,
                                                 stream>>>(
      n, table, pa.cols, B, V, K, shape.rows_per_group, aligned, normalize, Spart, Npart);
  DM_CUDA_CHECK_LAUNCH();
  components_finish_kernel<float><<<ceil_div(B * K, 256), 256, 0, stream>>>(
      Spart, Npart, slices, pa.Apart, pa.nblk, B, K, normalize, out);
  DM_CUDA_CHECK_LAUNCH();
}

// K float32 components, once per component (See Note [Per component]):
// log_lik's shared-alpha forward of each component into row k of a (K, B)
// scratch, then out (B, K) is its transpose.
void launch_components_as_shared(const Tensor& counts, const Tensor& log_alpha, int64_t B,
                                 int64_t V, int K, bool normalize, Tensor& out,
                                 cudaStream_t stream) {
  Tensor by_component = torch::stable::new_empty(log_alpha, {static_cast<int64_t>(K), B});
  auto* o = static_cast<float*>(by_component.mutable_data_ptr());
  for (int k = 0; k < K; ++k) {
    log_lik_shared_float(counts, row_view(log_alpha, k), B, V, normalize, o + k * B, stream);
  }
  // (B == 1: the transpose is already contiguous, and no copy is made.)
  out = torch::stable::contiguous(torch::stable::transpose(by_component, 0, 1));
}

// out: a new (B, K) tensor.
template <typename scalar_t, typename count_t>
void launch_forward_components(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                               int K, bool normalize, Tensor& out, cudaStream_t stream) {
  if constexpr (use_tables<scalar_t>()) {
    if (components_per_component_forward(B, V, K)) {
      launch_components_as_shared(counts, log_alpha, B, V, K, normalize, out, stream);
      return;
    }
  }
  out = torch::stable::new_empty(log_alpha, {B, static_cast<int64_t>(K)});
  auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
  if constexpr (use_tables<scalar_t>()) {
    with_component_block(K, [&](auto kb) {
      launch_components_table<count_t, decltype(kb)::value>(counts, log_alpha, B, V, K, normalize,
                                                            o, stream);
    });
  } else {
    launch_forward_rows<scalar_t, count_t, kComponentBlock>(counts, log_alpha, B, V, K, normalize,
                                                            o, stream);
  }
}

}  // namespace

Tensor log_lik_components_cuda(Tensor counts, Tensor log_alpha, bool normalize) {
  check_components(counts, log_alpha);
  if (wide_counts(counts, log_alpha)) {  // See Note [Wide integer counts]
    return to_float32(log_lik_components_cuda(counts, to_float64(log_alpha), normalize));
  }
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = as_contiguous(log_alpha);
  const int64_t B = counts.size(0), V = counts.size(1);
  const int K = static_cast<int>(log_alpha.size(0));
  if (B == 0 || V == 0 || K == 0) {
    return torch::stable::new_zeros(log_alpha, {B, static_cast<int64_t>(K)});
  }
  const cudaStream_t stream = current_stream(counts.get_device_index());
  Tensor out;
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      launch_forward_components<scalar_t, count_t>(counts, log_alpha, B, V, K, normalize, out,
                                                    stream);
    });
  });
  return out;
}

}  // namespace cuda
}  // namespace dirmult
