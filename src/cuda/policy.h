// Host policy of the CUDA ops: which kernel takes which shape, the cost
// models behind those choices, and the environment variable that overrides
// the components' choice. The launchers ask here and then launch; the
// measurements behind each threshold are in BENCHMARKS.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dirmult {
namespace cuda {

// ---- Shared alpha: log_lik, log_lik_backward, log_lik_with_grad.

// The table paths are float32 only: a float64 table would not fit the shared
// memory of a 1024-column block. On the GPU they pay from one row (See Note
// [Tables]).
template <typename scalar_t>
constexpr bool use_tables() {
  return std::is_same_v<scalar_t, float>;
}

// Small problems with shared alpha take forward_small_kernel: one launch and
// no scratch memory, since their time is host time. Its rows are a warp
// each on the math path, whose time grows with the row's length, so float32
// rows longer than kSmallMaxFloatColumns take the tables (one more launch
// and an allocation, less GPU time: BENCHMARKS.md); float64 has no tables.
constexpr int64_t kSmallMaxElements = int64_t{1} << 18;
constexpr int64_t kSmallMaxColumns = 1024;  // one chunk per row
constexpr int64_t kSmallMaxFloatColumns = 256;

template <typename scalar_t>
bool forward_small_applies(int64_t B, int64_t V) {
  const int64_t max_columns =
      std::is_same_v<scalar_t, float> ? kSmallMaxFloatColumns : kSmallMaxColumns;
  return V <= max_columns && B * V <= kSmallMaxElements;
}

// The float32 shared-alpha forward's table kernels.
enum class TableForward {
  kFillRing,     // forward_table_fill_ring_kernel: fills its own slices, finishes its rows
  kFillInBlock,  // forward_table_kernel<count_t, 1, true>: fills its own slice
  kRing,         // forward_table_ring_kernel: many rows per warp, 16-byte aligned float32 rows
  kTwoRows,      // forward_table_kernel, two rows in flight per warp
  kOneRow,       // forward_table_kernel, a row at a time
};

// What pick_table_forward needs to know of the device and of the count
// kernels' occupancy (one_wave_blocks of forward_table_kernel<count_t, 1>
// and <count_t, 2>; the latter 0 for 8-byte counts, which never take it).
struct TableForwardDevice {
  int64_t one_row_wave;
  int64_t two_row_wave;
  int sms;
  int max_smem_optin;  // bytes of shared memory a block may opt in to
};

// Row groups of a table kernel's grid (y): one wave of resident blocks
// (`wave`) over the chunks, at most a group per warp's worth of rows.
int64_t table_row_groups(int64_t B, int64_t num_chunks, int warps, int64_t wave);

// The kernel for B rows of V float32-alpha columns of counts of count_bytes
// bytes (float_counts: float32), `aligned` for 16-byte loads.
TableForward pick_table_forward(int64_t B, int64_t V, bool float_counts, size_t count_bytes,
                                bool aligned, const TableForwardDevice& device);

// Whether log_lik_with_grad's kernel fills its tables in its blocks
// (with_grad_kernel<..., kFill>), for its grid of row_tiles x col_chunks.
bool with_grad_fills_in_block(int64_t row_tiles, int64_t col_chunks);

// ---- K components: log_lik_components and its backward.

// Where the components' backward takes its two tables: they span K V
// columns and are filled before the column pass, which costs more than few
// rows' math path.
constexpr int64_t kComponentBackwardTableMinRows = 32;

// Components per block of the component-table kernels for K components:
// one pass over the counts up to 16.
inline int component_block(int64_t K) { return K <= 4 ? 4 : K <= 8 ? 8 : 16; }

// f(std::integral_constant<int, component_block(K)>{}): one instantiation
// per block size.
template <typename F>
void with_component_block(int64_t K, F&& f) {
  switch (component_block(K)) {
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    default:
      f(std::integral_constant<int, 16>{});
  }
}

// Whether K float32 components over B rows of V columns run log_lik's
// shared-alpha kernels once per component (See Note [Per component])
// instead of the fused component kernels: the cost models' pick
// (components_rule_coefs.h), unless DIRMULT_CUDA_COMPONENTS forces a way.
// Float32 only: float64 components always take the fused way.
bool components_per_component_forward(int64_t B, int64_t V, int64_t K);
bool components_per_component_backward(int64_t B, int64_t V, int64_t K);

// The cost models alone: whether K log_lik calls are predicted faster.
bool components_as_shared_forward(int64_t B, int64_t V, int64_t K);
bool components_as_shared_backward(int64_t B, int64_t V, int64_t K);

// DIRMULT_CUDA_COMPONENTS=fused or =per_component forces one way (so tests
// reach both ways at any shape, and scripts/tuning/components_crossover.py
// can time the fused way to refit the rule on another GPU without an edited
// build); unset, empty or auto: the cost models. Read once per process; the
// Python package checks the value on import (the clearer error on torch
// builds that crash on C++ errors).
enum class ComponentsWay { kByRule, kFused, kPerComponent };
ComponentsWay components_way_setting();

// ---- CSR counts: log_lik_csr (See Note [CSR tables]).

// The forward reads lnpoch of counts up to kMaxExactCount from a table of
// (V, 16, Kt) entries, gathered through L2 (or DRAM beyond it): always up
// to kCsrTableCachedBytes (filled in microseconds), and up to
// kCsrTableMaxBytes where its entries are at most a quarter of the
// nonzeros' terms (nnz K), so that filling it costs at most a quarter of
// the per-nonzero math it replaces (docs/PERFORMANCE_LEDGER.md, CSR
// counts). Otherwise the per-nonzero math.
constexpr int64_t kCsrTableCachedBytes = int64_t{32} << 20;
constexpr int64_t kCsrTableMaxBytes = int64_t{256} << 20;

inline bool csr_forward_uses_table(int64_t V, int64_t Kt, int64_t counts, int64_t terms,
                                   size_t elem_bytes) {
  const int64_t entries = V * Kt * counts;
  const int64_t bytes = entries * static_cast<int64_t>(elem_bytes);
  return bytes <= kCsrTableCachedBytes || (bytes <= kCsrTableMaxBytes && 4 * entries <= terms);
}

// The entries a (column, count) of the table holds: for more than one
// component, K rounded up to whole 16-byte loads where such a table is
// taken, so that the components' walks gather their entries in 16-byte
// loads (docs/PERFORMANCE_LEDGER.md); else K, and element loads. 0: no table.
inline int64_t csr_table_stride(int64_t V, int64_t K, int64_t counts, int64_t nnz,
                                size_t elem_bytes) {
  const int64_t per_load = 16 / static_cast<int64_t>(elem_bytes);
  const int64_t padded = K > 1 ? (K + per_load - 1) / per_load * per_load : K;
  if (csr_forward_uses_table(V, padded, counts, nnz * K, elem_bytes)) return padded;
  return csr_forward_uses_table(V, K, counts, nnz * K, elem_bytes) ? K : 0;
}

// Rows per warp of the table forward: `rows` (each finished by its own
// lane) where the rows are short and many, else one: long rows are the
// warp's walk, and few rows need a warp each to fill the GPU (16384 rows 32
// to a warp made 512 warps, 2x slower than a warp a row: BENCHMARKS.md).
constexpr int64_t kCsrLongRowNonzeros = 256;
constexpr int64_t kCsrShortRowsMinWarps = 4096;

inline bool csr_forward_short_rows(int64_t B, int64_t nnz, int rows) {
  return nnz < kCsrLongRowNonzeros * B && B >= kCsrShortRowsMinWarps * rows;
}

// Components a walk of the table forward sums: 16 (one read of the values
// for K = 16) where a warp takes a row, from 9 components; else 8, whose
// registers leave room for more warps where a warp takes 32 rows
// (docs/PERFORMANCE_LEDGER.md, CSR counts).
inline int csr_walk_components(int64_t K, bool short_rows) {
  return K > 8 && !short_rows ? 16 : 8;
}

}  // namespace cuda
}  // namespace dirmult
