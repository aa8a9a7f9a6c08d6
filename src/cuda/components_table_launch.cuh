// The launch shape and scratch of the component-table kernels, forward and
// backward (log_lik_components, log_lik_components_backward).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/ceil_div.cuh"
#include "kernels/components_table.cuh"
#include "kernels/table_layout.cuh"
#include "prepare_alpha.cuh"
#include "scratch.h"

namespace dirmult {
namespace cuda {

// grid (column slices of CompSlice<KB>::kCols columns, row groups,
// ceil(K / KB) component blocks): one wave of resident blocks (`wave`; See
// Note [One wave]), each row group a fixed range of rows (at least
// min_rows; the partials are summed in order: See Note [Determinism]); and
// at the front of the scratch layout, the (K, V) prepared alpha and its
// kKind table (TableScratch), which prepare() fills.
template <TableKind kKind, int KB>
struct ComponentTableLaunch {
  int64_t slices, k_blocks, rows_per_group, row_groups;
  TableScratch<kKind, TableLayout::kColumns> tables;

  ComponentTableLaunch(ScratchLayout& layout, int64_t B, int64_t V, int K, int64_t wave,
                       int64_t min_rows)
      : slices(ceil_div(V, CompSlice<KB>::kCols)),
        k_blocks(ceil_div(K, KB)),
        rows_per_group(ceil_div(
            B, std::max<int64_t>(1, std::min(ceil_div(B, min_rows), wave / (slices * k_blocks))))),
        row_groups(ceil_div(B, rows_per_group)),
        tables(layout, K, V) {}

  dim3 grid() const {
    return dim3(static_cast<unsigned>(slices), static_cast<unsigned>(row_groups),
                static_cast<unsigned>(k_blocks));
  }
};

}  // namespace cuda
}  // namespace dirmult
