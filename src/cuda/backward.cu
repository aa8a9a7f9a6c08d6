// CUDA backward ops: dirmult::log_lik_backward and
// dirmult::log_lik_components_backward.
#include <vector>

#include "backward_kernels.cuh"
#include "per_sample_backward_kernels.cuh"
#include "component_table_kernels.cuh"
#include "table_kernels.cuh"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {
namespace {

constexpr int kComponentBlockBwd = 4;  // components per pass in the backward

// grad_la (K, V) for shared / component alpha: one read of the counts.
// kTable: float32, K == 1, with the alpha * dpoch lookup table.
template <typename scalar_t, typename count_t, int KB, bool kTable>
void launch_backward_columns(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                             int64_t B, int64_t V, int K, scalar_t* grad_la, cudaStream_t stream) {
  constexpr auto kKernel = column_backward_kernel<scalar_t, count_t, KB, kTable>;
  const size_t smem = kTable ? kTableSmemBytes : 0;
  const int64_t k_blocks = ceil_div(K, KB);
  const ColumnTiling tiling = tile_columns(B, V, k_blocks, one_wave_blocks<kKernel>(kColThreads, smem));
  const int64_t parts = tiling.col_chunks * kColWarps;
  ScratchLayout layout;
  const int64_t alpha_at = layout.add(prepared_alpha_bytes<scalar_t>(K, V));
  const int64_t table_at = layout.add(kTable ? table_bytes(V, TableLayout::kChunkSlots) : 0);
  const int64_t c_at = layout.add(tiling.row_tiles * K * V * static_cast<int64_t>(sizeof(double)));
  const int64_t n_at = layout.add(B * parts * static_cast<int64_t>(sizeof(double)));
  const int64_t w_at = layout.add(weight_partial_bytes(B, K, parts));
  const Tensor ws = workspace(counts, layout.size());
  void* alpha_dst = ScratchLayout::at<char>(ws, alpha_at);
  float* table = kTable ? ScratchLayout::at<float>(ws, table_at) : nullptr;
  const PreparedAlpha<scalar_t> pa = [&] {
    if constexpr (kTable) {
      return prepare_alpha_and_table<TableKind::kAlphaDPoch, TableLayout::kChunkSlots>(
          log_alpha, 1, V, alpha_dst, false, table, stream);
    } else {
      return prepare_alpha<scalar_t>(log_alpha, K, V, alpha_dst, stream);
    }
  }();
  auto* Cpart = ScratchLayout::at<double>(ws, c_at);
  auto* Npart = ScratchLayout::at<double>(ws, n_at);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* g = static_cast<const scalar_t*>(grad.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const dim3 grid(static_cast<unsigned>(tiling.col_chunks), static_cast<unsigned>(tiling.row_tiles),
                  static_cast<unsigned>(k_blocks));
  kKernel<<<grid, kColThreads, smem, stream>>>(g, n, pa.cols, table, B, V, K, tiling, aligned,
                                               Cpart, Npart);
  DM_CUDA_CHECK_LAUNCH();
  launch_column_finish<scalar_t>(g, Npart, parts, Cpart, tiling.row_tiles, pa, B, V, K,
                                 ScratchLayout::at<double>(ws, w_at), grad_la, stream);
}

// grad_la (K, V) for K float32 components over many rows, with the
// component tables: the table kernel's column partials, the row totals, then
// the same finish as launch_backward_columns.
template <typename count_t, int KB>
void launch_components_backward_table(const Tensor& grad, const Tensor& counts,
                                      const Tensor& log_alpha, int64_t B, int64_t V, int K,
                                      float* grad_la, cudaStream_t stream) {
  constexpr int C = CompSlice<KB>::kCols;
  const int64_t slices = ceil_div(V, C), k_blocks = ceil_div(K, KB);
  const int64_t wave =
      one_wave_blocks<components_table_backward_kernel<count_t, KB>>(kCompThreads, kCompTableBytes);
  // One wave of resident blocks; row tiles are fixed ranges, summed in order.
  const int64_t tiles =
      std::max<int64_t>(1, std::min(ceil_div(B, 64), wave / (slices * k_blocks)));
  const int64_t rows_per_tile = ceil_div(B, tiles);
  const int64_t row_tiles = ceil_div(B, rows_per_tile);
  ScratchLayout layout;
  const TableScratch<TableKind::kAlphaDPoch, TableLayout::kColumns> tables(layout, K, V);
  const int64_t c_at = layout.add(row_tiles * K * V * static_cast<int64_t>(sizeof(double)));
  const int64_t n_at = layout.add(B * static_cast<int64_t>(sizeof(double)));
  const int64_t w_at = layout.add(weight_partial_bytes(B, K, 1));
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<float> pa = tables.prepare(ws, log_alpha, false, stream);
  const float* table = tables.table(ws);
  auto* Cpart = ScratchLayout::at<double>(ws, c_at);
  auto* N = ScratchLayout::at<double>(ws, n_at);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* g = static_cast<const float*>(grad.const_data_ptr());
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(row_tiles),
                  static_cast<unsigned>(k_blocks));
  components_table_backward_kernel<count_t, KB><<<grid, kCompThreads, kCompTableBytes, stream>>>(
      g, n, pa.cols, table, B, V, K, rows_per_tile, Cpart);
  DM_CUDA_CHECK_LAUNCH();
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  row_count_totals_kernel<count_t><<<ceil_div(B, 8), 256, 0, stream>>>(n, B, V, aligned, N);
  DM_CUDA_CHECK_LAUNCH();
  launch_column_finish<float>(g, N, 1, Cpart, row_tiles, pa, B, V, K,
                              ScratchLayout::at<double>(ws, w_at), grad_la, stream);
}

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

// Shared alpha: the table path (float32, use_tables: from one row), else
// the math path (float64).
template <typename scalar_t, typename count_t>
void launch_backward_shared(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                            int64_t B, int64_t V, scalar_t* grad_la, cudaStream_t stream) {
  constexpr bool kTables = use_tables<scalar_t>();
  launch_backward_columns<scalar_t, count_t, 1, kTables>(grad, counts, log_alpha, B, V, 1, grad_la,
                                                         stream);
}

template <typename scalar_t, typename count_t>
void launch_components_backward(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                                int64_t B, int64_t V, int K, scalar_t* grad_la,
                                cudaStream_t stream) {
  if constexpr (use_tables<scalar_t>()) {
    if (components_per_component(components_as_shared_backward(B, V, K))) {
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

std::tuple<Tensor, Tensor> log_lik_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha,
                                                 bool normalize, bool counts_grad) {
  const bool shared = check_log_lik_backward(grad, counts, log_alpha);
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

Tensor log_lik_components_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha) {
  check_components_backward(grad, counts, log_alpha);
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
