// Host launch of the math-path forward of shared or per-component alpha
// (forward_rows_kernel) and of the chunk partials' finish (finish_rows_kernel),
// shared by log_lik and log_lik_components.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include "kernels/finish_rows.cuh"
#include "kernels/forward_rows.cuh"
#include "kernels/row_chunks.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "prepare_alpha.cuh"
#include "scratch.h"

namespace dirmult {
namespace cuda {

template <typename scalar_t>
void launch_finish_rows(const RowPartial* partial, const double* Apart, int nblk_alpha,
                        const scalar_t* log_alpha, int64_t V, int64_t B, int K,
                        int64_t num_chunks, bool per_sample, bool normalize, scalar_t* out,
                        cudaStream_t stream) {
  finish_rows_kernel<scalar_t><<<ceil_div(B * K, finish_pairs_per_block(num_chunks)), 256, 0,
                                 stream>>>(partial, Apart, nblk_alpha, log_alpha, V, B, K,
                                           num_chunks, per_sample, normalize, out);
  DM_CUDA_CHECK_LAUNCH();
}

template <typename scalar_t, typename count_t, int KB>
void launch_forward_rows(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                         int K, bool normalize, scalar_t* out, cudaStream_t stream) {
  const RowSplit split = split_rows(B, V);
  ScratchLayout layout;
  const int64_t alpha_at = layout.add(prepared_alpha_bytes<scalar_t>(K, V));
  const int64_t partial_at = layout.add(
      split.num_chunks > 1 ? B * split.num_chunks * K * static_cast<int64_t>(sizeof(RowPartial)) : 0);
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<scalar_t> pa =
      prepare_alpha<scalar_t>(log_alpha, K, V, ScratchLayout::at<char>(ws, alpha_at), stream);
  RowPartial* partial = split.num_chunks > 1 ? ScratchLayout::at<RowPartial>(ws, partial_at) : nullptr;
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const int64_t blocks = ceil_div(B * split.num_chunks, kRowWarps);
  forward_rows_kernel<scalar_t, count_t, KB><<<blocks, kRowWarps * 32, 0, stream>>>(
      n, pa.cols, pa.Apart, pa.nblk, B, V, K, split, aligned, normalize, out, partial);
  DM_CUDA_CHECK_LAUNCH();
  if (split.num_chunks > 1) {
    launch_finish_rows<scalar_t>(partial, pa.Apart, pa.nblk, nullptr, V, B, K, split.num_chunks,
                                 false, normalize, out, stream);
  }
}

}  // namespace cuda
}  // namespace dirmult
