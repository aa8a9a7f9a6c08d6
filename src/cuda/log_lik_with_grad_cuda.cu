// dirmult::log_lik_with_grad on CUDA: the rows' log-likelihoods and the
// gradient of their sum, one read of the counts where the tables apply (See
// Note [Single pass]).
//
//   log_lik_with_grad_cuda -> launch_with_grad: prep_and_table_kernel (or
//   alpha_prep_kernel where the blocks fill their own tables, policy:
//   with_grad_fills_in_block) -> with_grad_kernel -> the column finish
//   (launch_column_backward.cuh), which also writes the rows' values.
//   Float64 or empty: log_lik_cuda, then log_lik_backward_cuda.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include <optional>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "../common/with_grad.h"
#include "kernels/vector_loads.cuh"
#include "kernels/with_grad.cuh"
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

// Row groups per block: two (512 threads) measured faster than one at tall
// and sparse (BENCHMARKS.md).
constexpr int kWithGradGroups = 2;

template <typename count_t>
void launch_with_grad(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                      bool normalize, float* out, float* grad_la, cudaStream_t stream) {
  constexpr int kThreads = kColThreads * kWithGradGroups;
  const ColumnTiling tiling = tile_columns(
      B, V, 1, one_wave_blocks<with_grad_kernel<count_t, kWithGradGroups>>(kThreads,
                                                                           kWithGradSmemBytes));
  const bool fill = with_grad_fills_in_block(tiling.row_tiles, tiling.col_chunks);
  const int64_t parts = tiling.col_chunks * kColWarps;
  const int64_t column_tiles = tiling.row_tiles * kWithGradGroups;  // Cpart rows
  ScratchLayout layout;
  std::optional<TableScratch<TableKind::kBoth, TableLayout::kChunkSlots>> tables;
  if (!fill) tables.emplace(layout, 1, V);
  const int64_t alpha_at = fill ? layout.add(prepared_alpha_bytes<float>(1, V)) : 0;
  const int64_t c_at = layout.add(column_tiles * V * static_cast<int64_t>(sizeof(double)));
  const int64_t n_at = layout.add(B * parts * static_cast<int64_t>(sizeof(double)));
  const int64_t l_at = layout.add(B * parts * static_cast<int64_t>(sizeof(double)));
  const int64_t w_at = layout.add(weight_partial_bytes(B, 1, parts));
  const Tensor ws = workspace(counts, layout.size());
  auto* Cpart = ScratchLayout::at<double>(ws, c_at);
  auto* Npart = ScratchLayout::at<double>(ws, n_at);
  auto* Lpart = ScratchLayout::at<double>(ws, l_at);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const dim3 grid(static_cast<unsigned>(tiling.col_chunks), static_cast<unsigned>(tiling.row_tiles));
  PreparedAlpha<float> pa;
  if (fill) {
    pa = prepare_alpha<float>(log_alpha, 1, V, ScratchLayout::at<char>(ws, alpha_at), stream);
    constexpr auto kKernel = with_grad_kernel<count_t, kWithGradGroups, true>;
    opt_in_smem<kKernel>(kThreads, kWithGradSmemBytes);
    launch_dependent(kKernel, grid, dim3(kThreads), kWithGradSmemBytes, stream, n, pa.cols,
                     static_cast<const float*>(nullptr), static_cast<const float*>(nullptr),
                     static_cast<const float*>(log_alpha.const_data_ptr()), B, V, tiling, aligned,
                     normalize, Cpart, Npart, Lpart);
  } else {
    pa = tables->prepare(ws, log_alpha, normalize, stream);
    float* table = tables->table(ws);
    // Right after prep_and_table_kernel (tables.prepare): its dependent.
    launch_dependent(with_grad_kernel<count_t, kWithGradGroups>, grid, dim3(kThreads),
                     kWithGradSmemBytes, stream, n, pa.cols, static_cast<const float*>(table),
                     static_cast<const float*>(second_table(table, V, TableLayout::kChunkSlots)),
                     static_cast<const float*>(nullptr), B, V, tiling, aligned, normalize, Cpart,
                     Npart, Lpart);
  }
  launch_column_finish<float>(nullptr, Npart, parts, Cpart, column_tiles, pa, B, V, 1,
                              ScratchLayout::at<double>(ws, w_at), grad_la, stream,
                              {Lpart, normalize, out});
}

}  // namespace

std::tuple<Tensor, Tensor> log_lik_with_grad_cuda(Tensor counts, Tensor log_alpha,
                                                  bool normalize) {
  check_log_lik_with_grad(counts, log_alpha);
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  // Float32 from one row, like the tables it reads (See Note [Single pass]):
  // few rows' forward+backward read a table of both kinds once instead of
  // filling one for the forward and both for the backward.
  // (Wide integer counts: log_lik_cuda's float64, See Note [Wide integer counts].)
  if (log_alpha.scalar_type() != ScalarType::Float || V == 0 || B == 0 ||
      wide_counts(counts, log_alpha)) {
    auto backward = [](Tensor g, Tensor c, Tensor la, bool norm, bool cg) {
      return log_lik_backward_cuda(g, c, la, norm, cg);
    };
    return log_lik_with_grad_from_ops(log_lik_cuda, backward, counts, log_alpha, normalize);
  }
  counts = native_counts(counts);
  log_alpha = as_contiguous(log_alpha);
  Tensor out = torch::stable::new_empty(log_alpha, batch_shape(counts));  // every row written
  Tensor grad_la = torch::stable::new_empty(log_alpha, log_alpha.sizes());
  const cudaStream_t stream = current_stream(counts.get_device_index());
  auto* o = static_cast<float*>(out.mutable_data_ptr());
  auto* g = static_cast<float*>(grad_la.mutable_data_ptr());
  DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
    launch_with_grad<count_t>(counts, log_alpha, B, V, normalize, o, g, stream);
  });
  return {out, grad_la};
}

}  // namespace cuda
}  // namespace dirmult
