// Host launch of the backward of shared or component alpha: the column pass
// (column_backward_kernel) and its finish (row_weights_kernel, then
// column_finish_kernel), shared by log_lik_backward, log_lik_components_backward
// and log_lik_with_grad (the finish).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include "kernels/column_backward.cuh"
#include "kernels/column_finish.cuh"
#include "kernels/table_layout.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "policy.h"
#include "prepare_alpha.cuh"
#include "scratch.h"

namespace dirmult {
namespace cuda {

// max_blocks: the blocks that are resident at once (one wave).
inline ColumnTiling tile_columns(int64_t B, int64_t V, int64_t k_blocks, int64_t max_blocks) {
  const int64_t col_chunks = ceil_div(V, kColsPerBlock);
  // A tile is a multiple of the row batch.
  const int64_t tiles = std::max<int64_t>(1, max_blocks / (col_chunks * k_blocks));
  int64_t rows = ceil_div(ceil_div(std::max<int64_t>(B, 1), tiles), kRowBatch) * kRowBatch;
  rows = std::max<int64_t>(rows, kRowBatch);
  return {col_chunks, rows, ceil_div(std::max<int64_t>(B, 1), rows)};
}

// Bytes of scratch memory for launch_column_finish's row-weight partials.
inline int64_t weight_partial_bytes(int64_t B, int K, int64_t parts) {
  return row_weights_blocks(B, parts) * K * static_cast<int64_t>(sizeof(double));
}

// Where launch_column_finish also writes the rows' log-likelihoods
// (log_lik_with_grad): the rows' lnpoch partials, laid out as Npart.
template <typename scalar_t>
struct RowOutputs {
  const double* Lpart = nullptr;
  bool normalize = false;
  scalar_t* out = nullptr;
};

// grad_la = column partials - a S from the row totals N (Npart: parts per
// row) and the column partials Cpart of row_tiles tiles; g null: unit row
// weights. Wpart: weight_partial_bytes of scratch memory.
template <typename scalar_t>
void launch_column_finish(const scalar_t* g, const double* Npart, int64_t parts,
                          const double* Cpart, int64_t row_tiles, const PreparedAlpha<scalar_t>& pa,
                          int64_t B, int64_t V, int K, double* Wpart, scalar_t* grad_la,
                          cudaStream_t stream, RowOutputs<scalar_t> rows = {}) {
  const int64_t wblocks = row_weights_blocks(B, parts);
  row_weights_kernel<scalar_t><<<dim3(static_cast<unsigned>(wblocks), static_cast<unsigned>(K)),
                                 kWeightThreads, 0, stream>>>(g, Npart, parts, pa.Apart, pa.nblk,
                                                              B, K, Wpart, rows.Lpart,
                                                              rows.normalize, rows.out);
  DM_CUDA_CHECK_LAUNCH();
  const dim3 fgrid(static_cast<unsigned>(ceil_div(V, finish_columns_per_block(row_tiles))),
                   static_cast<unsigned>(K));
  column_finish_kernel<scalar_t><<<fgrid, kFinishThreads, 0, stream>>>(
      Cpart, Wpart, wblocks, pa.Apart, pa.nblk, pa.cols, V, K, row_tiles, grad_la);
  DM_CUDA_CHECK_LAUNCH();
}


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

// Shared alpha: the table path (float32, use_tables: from one row), else
// the math path (float64).
template <typename scalar_t, typename count_t>
void launch_backward_shared(const Tensor& grad, const Tensor& counts, const Tensor& log_alpha,
                            int64_t B, int64_t V, scalar_t* grad_la, cudaStream_t stream) {
  constexpr bool kTables = use_tables<scalar_t>();
  launch_backward_columns<scalar_t, count_t, 1, kTables>(grad, counts, log_alpha, B, V, 1, grad_la,
                                                         stream);
}

}  // namespace cuda
}  // namespace dirmult
