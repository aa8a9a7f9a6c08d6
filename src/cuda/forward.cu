// CUDA forward ops: dirmult::log_lik and dirmult::log_lik_components.
#include "forward_kernels.cuh"
#include "component_table_kernels.cuh"
#include "table_kernels.cuh"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {
namespace {

constexpr int kComponentBlock = 8;  // components per pass over a row

// out (B, K) from counts (B, V) and prepared (K, V) alpha.
template <typename scalar_t, typename count_t, int KB>
void launch_forward_components(const Tensor& counts, const PreparedAlpha<scalar_t>& pa, int64_t B,
                               int64_t V, int K, bool normalize, scalar_t* out,
                               cudaStream_t stream) {
  const RowSplit split = split_rows(B, V);
  Tensor partial_ws;
  RowPartial* partial = nullptr;
  if (split.num_chunks > 1) {
    partial_ws = workspace(counts, B * split.num_chunks * K * static_cast<int64_t>(sizeof(RowPartial)));
    partial = static_cast<RowPartial*>(partial_ws.mutable_data_ptr());
  }
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const int64_t blocks = ceil_div(B * split.num_chunks, kRowWarps);
  forward_rows_kernel<scalar_t, count_t, KB><<<blocks, kRowWarps * 32, 0, stream>>>(
      n, pa.cols, pa.Apart, pa.nblk, B, V, K, split, aligned, normalize, out, partial);
  DM_CUDA_CHECK_LAUNCH();
  if (split.num_chunks > 1) {
    finish_rows_kernel<scalar_t><<<ceil_div(B * K, 8), 256, 0, stream>>>(
        partial, pa.Apart, pa.nblk, B, K, split.num_chunks, false, normalize, out);
    DM_CUDA_CHECK_LAUNCH();
  }
}

template <typename scalar_t, typename count_t>
void launch_forward_per_sample(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                               bool normalize, scalar_t* out, cudaStream_t stream) {
  const RowSplit split = split_rows(B, V);
  Tensor partial_ws;
  RowPartial* partial = nullptr;
  if (split.num_chunks > 1) {
    partial_ws = workspace(counts, B * split.num_chunks * static_cast<int64_t>(sizeof(RowPartial)));
    partial = static_cast<RowPartial*>(partial_ws.mutable_data_ptr());
  }
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n) && is_aligned<scalar_t>(la);
  const int64_t blocks = ceil_div(B * split.num_chunks, kRowWarps);
  forward_rows_per_sample_kernel<scalar_t, count_t><<<blocks, kRowWarps * 32, 0, stream>>>(
      n, la, B, V, split, aligned, normalize, out, partial);
  DM_CUDA_CHECK_LAUNCH();
  if (split.num_chunks > 1) {
    finish_rows_kernel<scalar_t><<<ceil_div(B, 8), 256, 0, stream>>>(
        partial, nullptr, 0, B, 1, split.num_chunks, true, normalize, out);
    DM_CUDA_CHECK_LAUNCH();
  }
}

// Shared float32 alpha over many rows: the lookup-table kernel.
template <typename count_t>
void launch_forward_table(const Tensor& counts, const PreparedAlpha<float>& pa, int64_t B,
                          int64_t V, bool normalize, float* out, cudaStream_t stream) {
  const ColumnTable table = build_table(counts, pa.cols, V, normalize, TableKind::kLogPoch, stream);
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  Tensor partial_ws;
  RowPartial* partial = nullptr;
  if (num_chunks > 1) {
    partial_ws = workspace(counts, B * num_chunks * static_cast<int64_t>(sizeof(RowPartial)));
    partial = static_cast<RowPartial*>(partial_ws.mutable_data_ptr());
  }
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  // One full wave of resident blocks over all chunks (a second, partial wave
  // would double the time of the rows it holds); every row's sum is one
  // warp's, in a fixed order, whatever the grid.
  const int per_sm = allow_table_smem<forward_table_kernel<count_t>>(kRowWarps * 32);
  const int64_t groups = std::max<int64_t>(
      1, std::min(ceil_div(B, kRowWarps),
                  static_cast<int64_t>(per_sm) * num_sms() / num_chunks));
  const dim3 grid(static_cast<unsigned>(num_chunks), static_cast<unsigned>(groups));
  forward_table_kernel<count_t><<<grid, kRowWarps * 32, kTableSmemBytes, stream>>>(
      n, table.data, pa.cols, pa.Apart, pa.nblk, B, V, num_chunks, aligned, normalize, out, partial);
  DM_CUDA_CHECK_LAUNCH();
  if (num_chunks > 1) {
    finish_rows_kernel<float><<<ceil_div(B, 8), 256, 0, stream>>>(
        partial, pa.Apart, pa.nblk, B, 1, num_chunks, false, normalize, out);
    DM_CUDA_CHECK_LAUNCH();
  }
}

// K float32 components over many rows: the component lookup-table kernel,
// then the per-(row, component) finish.
template <typename count_t, int KB>
void launch_components_table(const Tensor& counts, const PreparedAlpha<float>& pa, int64_t B,
                             int64_t V, int K, bool normalize, float* out, cudaStream_t stream) {
  constexpr int C = CompSlice<KB>::kCols;
  const ColumnTable table =
      build_table(counts, pa.cols, K * V, normalize, TableKind::kLogPoch, stream);
  const int64_t slices = ceil_div(V, C), k_blocks = ceil_div(K, KB);
  const int64_t s_bytes = B * slices * K * static_cast<int64_t>(sizeof(float));
  const int64_t n_offset = ceil_div(s_bytes, 16) * 16;  // Npart is double2: 16-byte aligned
  Tensor ws = workspace(counts, n_offset + B * slices * static_cast<int64_t>(sizeof(double2)));
  auto* Spart = static_cast<float*>(ws.mutable_data_ptr());
  auto* Npart = reinterpret_cast<double2*>(static_cast<char*>(ws.mutable_data_ptr()) + n_offset);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const int per_sm =
      allow_table_smem<components_table_forward_kernel<count_t, KB>>(kCompThreads, kCompTableBytes);
  // One wave of resident blocks; each group of rows is a fixed range.
  const int64_t groups = std::max<int64_t>(
      1, std::min(ceil_div(B, kCompWarps),
                  static_cast<int64_t>(per_sm) * num_sms() / (slices * k_blocks)));
  const int64_t rows_per_group = ceil_div(B, groups);
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(ceil_div(B, rows_per_group)),
                  static_cast<unsigned>(k_blocks));
  components_table_forward_kernel<count_t, KB><<<grid, kCompThreads, kCompTableBytes, stream>>>(
      n, table.data, pa.cols, B, V, K, rows_per_group, aligned, normalize, Spart, Npart);
  DM_CUDA_CHECK_LAUNCH();
  components_finish_kernel<float><<<ceil_div(B * K, 256), 256, 0, stream>>>(
      Spart, Npart, slices, pa.Apart, pa.nblk, B, K, normalize, out);
  DM_CUDA_CHECK_LAUNCH();
}

template <typename scalar_t, typename count_t>
bool try_components_table(const Tensor& counts, const PreparedAlpha<scalar_t>& pa, int64_t B,
                          int64_t V, int K, bool normalize, scalar_t* out, cudaStream_t stream) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (B < kTableMinRows) return false;
    switch (component_block(K)) {
      case 4:
        launch_components_table<count_t, 4>(counts, pa, B, V, K, normalize, out, stream);
        break;
      case 8:
        launch_components_table<count_t, 8>(counts, pa, B, V, K, normalize, out, stream);
        break;
      default:
        launch_components_table<count_t, 16>(counts, pa, B, V, K, normalize, out, stream);
    }
    return true;
  }
  return false;
}

// The table path is float32 only (a float64 table would not fit the shared
// memory of a 1024-column block).
template <typename scalar_t, typename count_t>
bool try_forward_table(const Tensor& counts, const PreparedAlpha<scalar_t>& pa, int64_t B,
                       int64_t V, bool normalize, scalar_t* out, cudaStream_t stream) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (B >= kTableMinRows) {
      launch_forward_table<count_t>(counts, pa, B, V, normalize, out, stream);
      return true;
    }
  }
  return false;
}

}  // namespace

Tensor log_lik_cuda(Tensor counts, Tensor log_alpha, bool normalize) {
  const bool shared = check_log_alpha(counts, log_alpha);
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = torch::stable::contiguous(log_alpha);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  Tensor out = torch::stable::new_zeros(log_alpha, batch_shape(counts));
  if (B == 0 || V == 0) return out;
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      if (shared) {
        const PreparedAlpha<scalar_t> pa = prepare_alpha<scalar_t>(log_alpha, 1, V, stream);
        if (try_forward_table<scalar_t, count_t>(counts, pa, B, V, normalize, o, stream)) return;
        launch_forward_components<scalar_t, count_t, 1>(counts, pa, B, V, 1, normalize, o, stream);
      } else {
        launch_forward_per_sample<scalar_t, count_t>(counts, log_alpha, B, V, normalize, o, stream);
      }
    });
  });
  return out;
}

Tensor log_lik_components_cuda(Tensor counts, Tensor log_alpha, bool normalize) {
  check_components(counts, log_alpha);
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = torch::stable::contiguous(log_alpha);
  const int64_t B = counts.size(0), V = counts.size(1);
  const int K = static_cast<int>(log_alpha.size(0));
  Tensor out = torch::stable::new_zeros(log_alpha, {B, static_cast<int64_t>(K)});
  if (B == 0 || V == 0 || K == 0) return out;
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
    const PreparedAlpha<scalar_t> pa = prepare_alpha<scalar_t>(log_alpha, K, V, stream);
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      if (try_components_table<scalar_t, count_t>(counts, pa, B, V, K, normalize, o, stream)) return;
      launch_forward_components<scalar_t, count_t, kComponentBlock>(counts, pa, B, V, K, normalize,
                                                                    o, stream);
    });
  });
  return out;
}

}  // namespace cuda
}  // namespace dirmult
