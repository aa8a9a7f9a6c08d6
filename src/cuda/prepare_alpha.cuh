// Host side of the alpha preparation: the (K, V) prepared columns and partial
// totals in scratch memory (alpha_prep_kernel), or those and a table in one
// launch (prep_and_table_kernel; See Note [Tables]).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include "kernels/alpha_prep.cuh"
#include "kernels/table_fill.cuh"
#include "kernels/table_layout.cuh"
#include "launch.h"
#include "scratch.h"

namespace dirmult {
namespace cuda {

// (K, V) log-concentrations prepared in scratch memory.
template <typename scalar_t>
struct PreparedAlpha {
  const ColumnAlpha<scalar_t>* cols;
  const double* Apart;
  int nblk;
};

template <typename scalar_t>
int64_t prepared_alpha_bytes(int64_t K, int64_t V) {
  return K * V * static_cast<int64_t>(sizeof(ColumnAlpha<scalar_t>)) +
         K * apart_stride(prep_blocks(V)) * static_cast<int64_t>(sizeof(double));
}

// Into `dst` (prepared_alpha_bytes, 16-byte aligned), part of the caller's
// scratch allocation.
template <typename scalar_t>
PreparedAlpha<scalar_t> prepare_alpha(const torch::stable::Tensor& log_alpha, int64_t K,
                                      int64_t V, void* dst, cudaStream_t stream) {
  const int nblk = prep_blocks(V);
  auto* cols = static_cast<ColumnAlpha<scalar_t>*>(dst);
  auto* Apart = reinterpret_cast<double*>(cols + K * V);
  if (K > 0) {
    alpha_prep_kernel<scalar_t><<<dim3(nblk, static_cast<unsigned>(K)), kPrepThreads, 0, stream>>>(
        static_cast<const scalar_t*>(log_alpha.const_data_ptr()), V, cols, Apart);
    DM_CUDA_CHECK_LAUNCH();
  }
  return {cols, Apart, nblk};
}

// Prepares (K, V) float alpha into alpha_dst (prepared_alpha_bytes) and
// fills `table` (table_bytes(K * V, kLayout, kKind)), in one launch.
template <TableKind kKind, TableLayout kLayout>
PreparedAlpha<float> prepare_alpha_and_table(const torch::stable::Tensor& log_alpha, int K,
                                             int64_t V, void* alpha_dst, bool normalize,
                                             float* table, cudaStream_t stream) {
  const int nblk = prep_blocks(V);
  auto* cols = static_cast<ColumnAlpha<float>*>(alpha_dst);
  auto* Apart = reinterpret_cast<double*>(cols + K * V);
  const int64_t padded_columns = table_columns(K * V, kLayout);
  const int64_t blocks = static_cast<int64_t>(nblk) * K + table_fill_blocks(padded_columns);
  prep_and_table_kernel<kKind, kLayout><<<blocks, kPrepThreads, 0, stream>>>(
      static_cast<const float*>(log_alpha.const_data_ptr()), V, K, nblk, cols, Apart, normalize,
      table, padded_columns);
  DM_CUDA_CHECK_LAUNCH();
  return {cols, Apart, nblk};
}

// The front of a table launcher's scratch memory: (K, V) prepared float
// alpha and its table, filled by one launch. Reserve, allocate, prepare:
//   ScratchLayout layout;
//   const TableScratch<kind, table_layout> tables(layout, K, V);
//   const int64_t mine = layout.add(...);            // the launcher's own
//   const Tensor ws = workspace(counts, layout.size());
//   const PreparedAlpha<float> pa = tables.prepare(ws, log_alpha, normalize, stream);
//   float* table = tables.table(ws);
template <TableKind kKind, TableLayout kLayout>
class TableScratch {
 public:
  TableScratch(ScratchLayout& layout, int K, int64_t V)
      : K_(K),
        V_(V),
        alpha_at_(layout.add(prepared_alpha_bytes<float>(K, V))),
        table_at_(layout.add(table_bytes(K * V, kLayout, kKind))) {}

  float* table(const torch::stable::Tensor& ws) const {
    return ScratchLayout::at<float>(ws, table_at_);
  }

  PreparedAlpha<float> prepare(const torch::stable::Tensor& ws,
                               const torch::stable::Tensor& log_alpha, bool normalize,
                               cudaStream_t stream) const {
    return prepare_alpha_and_table<kKind, kLayout>(
        log_alpha, K_, V_, ScratchLayout::at<char>(ws, alpha_at_), normalize, table(ws), stream);
  }

 private:
  int K_;
  int64_t V_;
  int64_t alpha_at_, table_at_;
};

}  // namespace cuda
}  // namespace dirmult
