// dirmult::log_lik on CUDA: the rows' Dirichlet-multinomial log-likelihoods.
//
//   log_lik_cuda
//     shared alpha:     launch_forward_shared -> forward_small_kernel
//                         | the table kernels (launch_forward_table; policy:
//                           pick_table_forward) | forward_rows_kernel (float64)
//     per-sample alpha: launch_forward_per_sample
//   then finish_rows_kernel where rows were split into chunks.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include <type_traits>
#include <utility>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "kernels/forward_rows.cuh"
#include "kernels/forward_table.cuh"
#include "kernels/forward_table_ring.cuh"
#include "kernels/per_sample_forward.cuh"
#include "kernels/per_sample_forward_float.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "launch_forward_rows.cuh"
#include "ops_cuda.h"
#include "policy.h"
#include "prepare_alpha.cuh"
#include "scratch.h"
#include "tensors.h"

namespace dirmult {
namespace cuda {
namespace {

// Per-sample alpha: forward_per_sample_float_kernel for float32 (written to
// an instruction budget), forward_rows_per_sample_kernel for float64.
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
  if constexpr (std::is_same_v<scalar_t, float>) {
    auto launch = [&](auto norm) {
      forward_per_sample_float_kernel<count_t, decltype(norm)::value>
          <<<blocks, kRowWarps * 32, 0, stream>>>(n, la, B, V, split, aligned, out, partial);
    };
    if (normalize) {
      launch(std::true_type{});
    } else {
      launch(std::false_type{});
    }
  } else {
    forward_rows_per_sample_kernel<scalar_t, count_t><<<blocks, kRowWarps * 32, 0, stream>>>(
        n, la, B, V, split, aligned, normalize, out, partial);
  }
  DM_CUDA_CHECK_LAUNCH();
  if (split.num_chunks > 1) {
    launch_finish_rows<scalar_t>(partial, nullptr, 0, la, V, B, 1, split.num_chunks, true,
                                 normalize, out, stream);
  }
}

template <typename scalar_t, typename count_t>
void launch_forward_small(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                          bool normalize, scalar_t* out, cudaStream_t stream) {
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  forward_small_kernel<scalar_t, count_t>
      <<<ceil_div(B, kRowWarps), kRowWarps * 32, forward_small_smem_bytes<scalar_t>(V), stream>>>(
          n, static_cast<const scalar_t*>(log_alpha.const_data_ptr()), B, V, prep_blocks(V), aligned,
          normalize, out);
  DM_CUDA_CHECK_LAUNCH();
}

// forward_table_fill_ring_kernel (TableForward::kFillRing): one launch that
// prepares no columns, only the partial totals of alpha for the finish, and
// finishes the rows behind a grid barrier where the device runs cooperative
// launches (else finish_rows_kernel after it).
void launch_forward_table_fill_ring(const float* n, const float* la, int64_t B, int64_t V,
                                    bool normalize, float* out, const Tensor& like,
                                    cudaStream_t stream) {
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  const int nblk = prep_blocks(V);
  ScratchLayout layout;
  const int64_t apart_at = layout.add(apart_stride(nblk) * static_cast<int64_t>(sizeof(double)));
  const int64_t partial_at = layout.add(B * num_chunks * static_cast<int64_t>(sizeof(RowPartial)));
  const Tensor ws = workspace(like, layout.size());
  auto* Apart = ScratchLayout::at<double>(ws, apart_at);
  RowPartial* partial = ScratchLayout::at<RowPartial>(ws, partial_at);
  constexpr auto kKernel = forward_table_fill_ring_kernel<float>;
  // Fewer chunks than SMs: blocks beside them that only compute alpha's
  // partial totals (a pair of slices each), from the start.
  const int64_t blocks = std::min(num_chunks + ceil_div(nblk, 2),
                                  one_wave_blocks<kKernel>(kRingWarps * 32, kRingSmemBytes));
  const RowOut o{num_chunks, normalize, out, partial};
  if (try_launch_cooperative(kKernel, dim3(static_cast<unsigned>(blocks)), dim3(kRingWarps * 32),
                             kRingSmemBytes, stream, n, la, Apart, nblk, B, V, o, true)) {
    return;
  }
  kKernel<<<static_cast<unsigned>(blocks), kRingWarps * 32, kRingSmemBytes, stream>>>(
      n, la, Apart, nblk, B, V, o, false);
  DM_CUDA_CHECK_LAUNCH();
  launch_finish_rows<float>(partial, Apart, nblk, nullptr, V, B, 1, num_chunks, false, normalize,
                            out, stream);
}

// forward_table_kernel<count_t, 1, true> (TableForward::kFillInBlock): a
// block per chunk, each filling its slice while its first row loads, as a
// dependent of alpha_prep_kernel (cols and Apart, needed only for rare
// counts and the finish). One row in flight per warp: two spilled registers
// around the fill (BENCHMARKS.md).
template <typename count_t>
void launch_forward_table_fill(const count_t* n, const Tensor& log_alpha, int64_t B, int64_t V,
                               bool aligned, bool normalize, float* out, const Tensor& like,
                               cudaStream_t stream) {
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  const auto* la = static_cast<const float*>(log_alpha.const_data_ptr());
  ScratchLayout layout;
  const int64_t alpha_at = layout.add(prepared_alpha_bytes<float>(1, V));
  const int64_t partial_at = layout.add(B * num_chunks * static_cast<int64_t>(sizeof(RowPartial)));
  const Tensor ws = workspace(like, layout.size());
  const PreparedAlpha<float> pa =
      prepare_alpha<float>(log_alpha, 1, V, ScratchLayout::at<char>(ws, alpha_at), stream);
  RowPartial* partial = ScratchLayout::at<RowPartial>(ws, partial_at);
  const RowOut o{num_chunks, normalize, out, partial};
  constexpr auto kKernel = forward_table_kernel<count_t, 1, true>;
  opt_in_smem<kKernel>(kRowWarps * 32, kTableSmemBytes);
  launch_dependent(kKernel, dim3(static_cast<unsigned>(num_chunks)), dim3(kRowWarps * 32),
                   kTableSmemBytes, stream, n, static_cast<const float*>(nullptr), la, pa.cols,
                   pa.Apart, pa.nblk, B, V, aligned, o);
  launch_finish_rows<float>(partial, pa.Apart, pa.nblk, nullptr, V, B, 1, num_chunks, false,
                            normalize, out, stream);
}

// Shared float32 alpha over many rows: the lookup-table kernels (See Note
// [Tables]), the kernel picked by pick_table_forward.
template <typename count_t>
void launch_forward_table(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                          bool normalize, float* out, cudaStream_t stream) {
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  TableForwardDevice device{};
  device.one_row_wave =
      one_wave_blocks<forward_table_kernel<count_t, 1>>(kRowWarps * 32, kTableSmemBytes);
  if constexpr (sizeof(count_t) <= 4) {
    device.two_row_wave =
        one_wave_blocks<forward_table_kernel<count_t, 2>>(kRowWarps * 32, kTableSmemBytes);
  }
  device.sms = num_sms();
  device.max_smem_optin = cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
  const TableForward kind = pick_table_forward(B, V, std::is_same_v<count_t, float>,
                                               sizeof(count_t), aligned, device);
  if (kind == TableForward::kFillRing) {
    if constexpr (std::is_same_v<count_t, float>) {
      launch_forward_table_fill_ring(n, static_cast<const float*>(log_alpha.const_data_ptr()), B,
                                     V, normalize, out, counts, stream);
    }
    return;
  }
  if (kind == TableForward::kFillInBlock) {
    launch_forward_table_fill<count_t>(n, log_alpha, B, V, aligned, normalize, out, counts,
                                       stream);
    return;
  }
  ScratchLayout layout;
  const TableScratch<TableKind::kLogPoch, TableLayout::kChunkSlots> tables(layout, 1, V);
  const int64_t partial_at =
      layout.add(num_chunks > 1 ? B * num_chunks * static_cast<int64_t>(sizeof(RowPartial)) : 0);
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<float> pa = tables.prepare(ws, log_alpha, normalize, stream);
  const float* table = tables.table(ws);
  RowPartial* partial = num_chunks > 1 ? ScratchLayout::at<RowPartial>(ws, partial_at) : nullptr;
  const RowOut o{num_chunks, normalize, out, partial};
  // Right after prep_and_table_kernel (tables.prepare): its dependent. One
  // wave of resident blocks over all chunks (See Note [One wave]); every
  // row's sum is one warp's, in a fixed order, whatever the grid (See Note
  // [Batch invariance]).
  auto grid = [&](auto kernel, int warps, size_t smem) {
    const int64_t wave = one_wave_blocks<decltype(kernel)::value>(warps * 32, smem);
    const int64_t groups = table_row_groups(B, num_chunks, warps, wave);
    return dim3(static_cast<unsigned>(num_chunks), static_cast<unsigned>(groups));
  };
  auto launch_rows = [&](auto kernel) {
    constexpr auto kKernel = decltype(kernel)::value;
    launch_dependent(kKernel, grid(kernel, kRowWarps, kTableSmemBytes), dim3(kRowWarps * 32),
                     kTableSmemBytes, stream, n, table, static_cast<const float*>(nullptr),
                     pa.cols, pa.Apart, pa.nblk, B, V, aligned, o);
  };
  using std::integral_constant;
  switch (kind) {
    case TableForward::kRing:
      if constexpr (std::is_same_v<count_t, float>) {
        constexpr auto kKernel = forward_table_ring_kernel<float>;
        const auto tag = integral_constant<decltype(kKernel), kKernel>{};
        launch_dependent(kKernel, grid(tag, kRingWarps, kRingSmemBytes), dim3(kRingWarps * 32),
                         kRingSmemBytes, stream, n, table, pa.cols, pa.Apart, pa.nblk, B, V, o);
      }
      break;
    case TableForward::kTwoRows:
      if constexpr (sizeof(count_t) <= 4) {
        constexpr auto kKernel = forward_table_kernel<count_t, 2>;
        launch_rows(integral_constant<decltype(kKernel), kKernel>{});
      }
      break;
    default: {
      constexpr auto kKernel = forward_table_kernel<count_t, 1>;
      launch_rows(integral_constant<decltype(kKernel), kKernel>{});
      break;
    }
  }
  if (num_chunks > 1) {
    launch_finish_rows<float>(partial, pa.Apart, pa.nblk, nullptr, V, B, 1, num_chunks, false,
                              normalize, out, stream);
  }
}

// Shared alpha: one launch for small problems, else the table path
// (float32, use_tables) or the math path (float64).
template <typename scalar_t, typename count_t>
void launch_forward_shared(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                           bool normalize, scalar_t* out, cudaStream_t stream) {
  if (forward_small_applies<scalar_t>(B, V)) {
    launch_forward_small<scalar_t, count_t>(counts, log_alpha, B, V, normalize, out, stream);
  } else if constexpr (use_tables<scalar_t>()) {
    launch_forward_table<count_t>(counts, log_alpha, B, V, normalize, out, stream);
  } else {
    launch_forward_rows<scalar_t, count_t, 1>(counts, log_alpha, B, V, 1, normalize, out, stream);
  }
}

}  // namespace

void log_lik_shared_float(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                          bool normalize, float* out, cudaStream_t stream) {
  DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
    launch_forward_shared<float, count_t>(counts, log_alpha, B, V, normalize, out, stream);
  });
}

Tensor log_lik_cuda(Tensor counts, Tensor log_alpha, bool normalize) {
  const bool shared = check_log_alpha(counts, log_alpha);
  if (wide_counts(counts, log_alpha)) {  // See Note [Wide integer counts]
    return to_float32(log_lik_cuda(counts, to_float64(log_alpha), normalize));
  }
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = as_contiguous(log_alpha);
  const int64_t V = counts.size(counts.dim() - 1);
  const int64_t B = num_rows(counts);
  if (B == 0 || V == 0) return torch::stable::new_zeros(log_alpha, batch_shape(counts));
  Tensor out = torch::stable::new_empty(log_alpha, batch_shape(counts));  // every row written
  const cudaStream_t stream = current_stream(counts.get_device_index());
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      if (shared) {
        launch_forward_shared<scalar_t, count_t>(counts, log_alpha, B, V, normalize, o, stream);
      } else {
        launch_forward_per_sample<scalar_t, count_t>(counts, log_alpha, B, V, normalize, o, stream);
      }
    });
  });
  return out;
}


}  // namespace cuda
}  // namespace dirmult
