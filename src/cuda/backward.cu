// CUDA backward ops: dirmult::log_lik_backward and
// dirmult::log_lik_components_backward.
#include <vector>

#include "backward_kernels.cuh"
#include "component_table_kernels.cuh"
#include "table_kernels.cuh"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {
namespace {

constexpr int kComponentBlockBwd = 4;  // components per pass in the backward

// grad_la (K, V) for shared / component alpha: one read of the counts.
template <typename scalar_t, typename count_t, int KB>
void launch_backward_columns(const Tensor& grad, const Tensor& counts,
                             const PreparedAlpha<scalar_t>& pa, int64_t B, int64_t V, int K,
                             scalar_t* grad_la, cudaStream_t stream) {
  const int64_t k_blocks = ceil_div(K, KB);
  const ColumnTiling tiling = tile_columns(B, V, k_blocks);
  const int64_t c_bytes = tiling.row_tiles * K * V * static_cast<int64_t>(sizeof(double));
  const int64_t n_bytes = B * tiling.col_chunks * static_cast<int64_t>(sizeof(double));
  const int64_t w_bytes = B * K * static_cast<int64_t>(sizeof(double));
  const int64_t s_bytes = K * static_cast<int64_t>(sizeof(double));
  Tensor ws = workspace(counts, c_bytes + n_bytes + w_bytes + s_bytes);
  auto* base = static_cast<char*>(ws.mutable_data_ptr());
  auto* Cpart = reinterpret_cast<double*>(base);
  auto* Npart = reinterpret_cast<double*>(base + c_bytes);
  auto* w = reinterpret_cast<double*>(base + c_bytes + n_bytes);
  auto* S = reinterpret_cast<double*>(base + c_bytes + n_bytes + w_bytes);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* g = static_cast<const scalar_t*>(grad.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const dim3 grid(static_cast<unsigned>(tiling.col_chunks), static_cast<unsigned>(tiling.row_tiles),
                  static_cast<unsigned>(k_blocks));
  bool tabled = false;
  if constexpr (std::is_same_v<scalar_t, float> && KB == 1) {
    if (K == 1 && B >= kTableMinRows) {
      const ColumnTable table = build_table(counts, pa.cols, V, false, TableKind::kAlphaDPoch, stream);
      allow_table_smem<column_backward_kernel<float, count_t, 1, true>>(kColThreads);
      column_backward_kernel<float, count_t, 1, true><<<grid, kColThreads, kTableSmemBytes, stream>>>(
          g, n, pa.cols, table.data, B, V, K, tiling, aligned, Cpart, Npart);
      DM_CUDA_CHECK_LAUNCH();
      tabled = true;
    }
  }
  if (!tabled) {
    column_backward_kernel<scalar_t, count_t, KB, false><<<grid, kColThreads, 0, stream>>>(
        g, n, pa.cols, nullptr, B, V, K, tiling, aligned, Cpart, Npart);
    DM_CUDA_CHECK_LAUNCH();
  }
  row_weights_kernel<scalar_t><<<ceil_div(B * K, 8), 256, 0, stream>>>(
      g, Npart, tiling.col_chunks, pa.Apart, pa.nblk, B, K, w);
  DM_CUDA_CHECK_LAUNCH();
  sum_weights_kernel<<<K, kFinishThreads, 0, stream>>>(w, pa.Apart, pa.nblk, B, K, S);
  DM_CUDA_CHECK_LAUNCH();
  const dim3 fgrid(static_cast<unsigned>(ceil_div(V, 32)), static_cast<unsigned>(K));
  column_finish_kernel<scalar_t><<<fgrid, kFinishThreads, 0, stream>>>(
      Cpart, S, pa.cols, V, K, tiling.row_tiles, grad_la);
  DM_CUDA_CHECK_LAUNCH();
}

// grad_la (K, V) for K float32 components over many rows, with the
// component tables: the table kernel's column partials, the row totals and
// weights, then the same finish as launch_backward_columns.
template <typename count_t, int KB>
void launch_components_backward_table(const Tensor& grad, const Tensor& counts,
                                      const PreparedAlpha<float>& pa, int64_t B, int64_t V,
                                      int K, float* grad_la, cudaStream_t stream) {
  constexpr int C = CompSlice<KB>::kCols;
  const ColumnTable table =
      build_table(counts, pa.cols, K * V, false, TableKind::kAlphaDPoch, stream);
  const int64_t slices = ceil_div(V, C), k_blocks = ceil_div(K, KB);
  const int per_sm =
      allow_table_smem<components_table_backward_kernel<count_t, KB>>(kCompThreads, kCompTableBytes);
  // One wave of resident blocks; row tiles are fixed ranges, summed in order.
  const int64_t tiles = std::max<int64_t>(
      1, std::min(ceil_div(B, 64), static_cast<int64_t>(per_sm) * num_sms() / (slices * k_blocks)));
  const int64_t rows_per_tile = ceil_div(B, tiles);
  const int64_t row_tiles = ceil_div(B, rows_per_tile);
  const int64_t c_bytes = row_tiles * K * V * static_cast<int64_t>(sizeof(double));
  const int64_t n_bytes = B * static_cast<int64_t>(sizeof(double));
  const int64_t w_bytes = B * K * static_cast<int64_t>(sizeof(double));
  Tensor ws = workspace(counts, c_bytes + n_bytes + w_bytes + K * static_cast<int64_t>(sizeof(double)));
  auto* base = static_cast<char*>(ws.mutable_data_ptr());
  auto* Cpart = reinterpret_cast<double*>(base);
  auto* N = reinterpret_cast<double*>(base + c_bytes);
  auto* w = reinterpret_cast<double*>(base + c_bytes + n_bytes);
  auto* S = reinterpret_cast<double*>(base + c_bytes + n_bytes + w_bytes);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* g = static_cast<const float*>(grad.const_data_ptr());
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(row_tiles),
                  static_cast<unsigned>(k_blocks));
  components_table_backward_kernel<count_t, KB><<<grid, kCompThreads, kCompTableBytes, stream>>>(
      g, n, pa.cols, table.data, B, V, K, rows_per_tile, Cpart);
  DM_CUDA_CHECK_LAUNCH();
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  row_count_totals_kernel<count_t><<<ceil_div(B, 8), 256, 0, stream>>>(n, B, V, aligned, N);
  DM_CUDA_CHECK_LAUNCH();
  row_weights_kernel<float><<<ceil_div(B * K, 8), 256, 0, stream>>>(g, N, 1, pa.Apart, pa.nblk,
                                                                     B, K, w);
  DM_CUDA_CHECK_LAUNCH();
  sum_weights_kernel<<<K, kFinishThreads, 0, stream>>>(w, pa.Apart, pa.nblk, B, K, S);
  DM_CUDA_CHECK_LAUNCH();
  const dim3 fgrid(static_cast<unsigned>(ceil_div(V, 32)), static_cast<unsigned>(K));
  column_finish_kernel<float><<<fgrid, kFinishThreads, 0, stream>>>(Cpart, S, pa.cols, V, K,
                                                                    row_tiles, grad_la);
  DM_CUDA_CHECK_LAUNCH();
}

template <typename scalar_t, typename count_t>
bool try_components_backward_table(const Tensor& grad, const Tensor& counts,
                                   const PreparedAlpha<scalar_t>& pa, int64_t B, int64_t V, int K,
                                   scalar_t* grad_la, cudaStream_t stream) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (B < kTableMinRows) return false;
    switch (component_block(K)) {
      case 4:
        launch_components_backward_table<count_t, 4>(grad, counts, pa, B, V, K, grad_la, stream);
        break;
      case 8:
        launch_components_backward_table<count_t, 8>(grad, counts, pa, B, V, K, grad_la, stream);
        break;
      default:
        launch_components_backward_table<count_t, 16>(grad, counts, pa, B, V, K, grad_la, stream);
    }
    return true;
  }
  return false;
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

}  // namespace

std::tuple<Tensor, Tensor> log_lik_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha,
                                                 bool normalize, bool counts_grad) {
  const bool shared = check_log_lik_backward(grad, counts, log_alpha);
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = torch::stable::contiguous(log_alpha);
  grad = torch::stable::contiguous(grad);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  Tensor grad_la = torch::stable::new_zeros(log_alpha, log_alpha.sizes());
  std::vector<int64_t> counts_grad_shape{0};
  if (counts_grad) counts_grad_shape.assign(counts.sizes().begin(), counts.sizes().end());
  Tensor grad_counts = torch::stable::new_zeros(log_alpha, counts_grad_shape);
  if (B == 0 || V == 0) return {grad_la, grad_counts};
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* gla = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
    auto* gc = counts_grad ? static_cast<scalar_t*>(grad_counts.mutable_data_ptr()) : nullptr;
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      if (shared) {
        const PreparedAlpha<scalar_t> pa = prepare_alpha<scalar_t>(log_alpha, 1, V, stream);
        launch_backward_columns<scalar_t, count_t, 1>(grad, counts, pa, B, V, 1, gla, stream);
        if (gc != nullptr) {
          launch_backward_elementwise<scalar_t, count_t>(grad, counts, log_alpha, pa.Apart,
                                                         pa.nblk, false, B, V, normalize,
                                                         nullptr, gc, stream);
        }
      } else {
        launch_backward_elementwise<scalar_t, count_t>(grad, counts, log_alpha, nullptr, 0, true,
                                                       B, V, normalize, gla, gc, stream);
      }
    });
  });
  return {grad_la, grad_counts};
}

Tensor log_lik_components_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha) {
  check_components_backward(grad, counts, log_alpha);
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = torch::stable::contiguous(log_alpha);
  grad = torch::stable::contiguous(grad);
  const int64_t B = counts.size(0), V = counts.size(1);
  const int K = static_cast<int>(log_alpha.size(0));
  Tensor grad_la = torch::stable::new_zeros(log_alpha, log_alpha.sizes());
  if (B == 0 || V == 0 || K == 0) return grad_la;
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* gla = static_cast<scalar_t*>(grad_la.mutable_data_ptr());
    const PreparedAlpha<scalar_t> pa = prepare_alpha<scalar_t>(log_alpha, K, V, stream);
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      if (try_components_backward_table<scalar_t, count_t>(grad, counts, pa, B, V, K, gla,
                                                           stream)) {
        return;
      }
      launch_backward_columns<scalar_t, count_t, kComponentBlockBwd>(grad, counts, pa, B, V, K,
                                                                     gla, stream);
    });
  });
  return grad_la;
}

}  // namespace cuda
}  // namespace dirmult
