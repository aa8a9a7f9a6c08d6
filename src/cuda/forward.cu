// CUDA forward ops: dirmult::log_lik and dirmult::log_lik_components.
#include "forward_kernels.cuh"
#include "per_sample_kernels.cuh"
#include "component_table_kernels.cuh"
#include "table_kernels.cuh"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {
namespace {

constexpr int kComponentBlock = 8;  // components per pass over a row
constexpr int64_t kMinRowsPerWarpForTwo = 16;  // see launch_forward_table

// out (B, K) from counts (B, V) and (K, V) log_alpha, the math path.
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
    launch_finish_rows<scalar_t>(partial, pa.Apart, pa.nblk, B, K, split.num_chunks, false,
                                 normalize, out, stream);
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
    launch_finish_rows<scalar_t>(partial, nullptr, 0, B, 1, split.num_chunks, true, normalize, out,
                                 stream);
  }
}

// Shared float32 alpha over many rows: the lookup-table kernels.
enum class TableForward {
  kRing,      // forward_table_ring_kernel: many rows per warp, 16-byte aligned float32 rows
  kTwoRows,   // forward_table_kernel, two rows in flight per warp: many rows per warp
  kOneRow,    // forward_table_kernel, a row at a time
};

// Row groups of a table kernel's grid (y): one wave of resident blocks
// (`wave`) over the chunks, at most a group per warp's worth of rows.
inline int64_t table_row_groups(int64_t B, int64_t num_chunks, int warps, int64_t wave) {
  return std::max<int64_t>(1, std::min(ceil_div(B, warps), wave / num_chunks));
}

// Whether a block of forward_table_fill_ring_kernel fits the device's
// shared memory.
inline bool fill_ring_fits() {
  return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>() >=
         static_cast<int>(kRingSmemBytes + kRingFillStaticBytes);
}

template <typename count_t>
TableForward pick_table_forward(int64_t B, int64_t num_chunks, bool aligned) {
  // Two rows in flight per warp where every warp has many rows (tall,
  // sparse: measured 7-8% faster), or where the grid is the same either way
  // and its warps have two rows or more: the same blocks with twice the
  // bytes in flight per warp (wide 64x262144 57.7 -> 52.0 us, 40x210000
  // 43.8 -> 40.4). One where the one-row kernel's grid has more blocks (its
  // block takes fewer resources: 128x131072 46.1 vs 47.6 us; mid). 8-byte
  // counts: one (registers). Float32 aligned counts take the ring kernel (a
  // block per SM) where its grid is one wave, and where every warp has many
  // rows only if the chunks spread evenly over the SMs: tall 77.3 -> 71.6 us
  // per call; sparse's 16 chunks leave 4 of 132 SMs idle (293.4 vs 291.7).
  // GPU time per call (CUDA graph) of ring vs two-row or one-row kernels:
  // mid 8192x1024 16.8 vs 20.9 us, 128x131072 36.9 vs 42.2, 256x65536 33.2
  // vs 37.9; in two waves 64x262144 45.5 vs 45.4 (now
  // launch_forward_table_fill's).
  const int64_t one_row_wave =
      one_wave_blocks<forward_table_kernel<count_t, 1>>(kRowWarps * 32, kTableSmemBytes);
  const bool many_rows = B * num_chunks >= kMinRowsPerWarpForTwo * kRowWarps * one_row_wave;
  if (std::is_same_v<count_t, float> && aligned &&
      (many_rows ? num_sms() % num_chunks == 0 : num_chunks <= num_sms()) &&
      cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>() >=
          static_cast<int>(kRingSmemBytes)) {
    return TableForward::kRing;
  }
  if constexpr (sizeof(count_t) <= 4) {
    const int64_t two_row_wave =
        one_wave_blocks<forward_table_kernel<count_t, 2>>(kRowWarps * 32, kTableSmemBytes);
    const int64_t groups = table_row_groups(B, num_chunks, kRowWarps, one_row_wave);
    const bool same_grid = table_row_groups(B, num_chunks, kRowWarps, two_row_wave) == groups;
    if (many_rows || (same_grid && B >= 2 * kRowWarps * groups)) return TableForward::kTwoRows;
  }
  return TableForward::kOneRow;
}

// Whether the forward's table is filled by the count kernel's blocks
// (launch_forward_table_fill): where its grid has one block per chunk (a
// group of rows: few rows, many chunks), so that each slice of a global
// table would be written once and read once, after a fill that every block
// waits for. GPU time per call (CUDA graph), against the global table's
// best kernel: 64x262144 43.1 vs 45.4 us, 40x210000 34.1 vs 34.9,
// 32x1048576 107.6 vs 113.6, 32x262144 32.9 vs 36.0. With two groups or
// more each chunk's fill would be repeated: 128x131072 53.6 vs 36.9. With
// few chunks, few blocks fill 1024 columns each (two per thread) where the
// global fill spreads its entries over every SM (fifteenth session, GPU
// time per call, in-block vs global, float32 aligned): 1x2048 11.3 vs 7.3
// us, 1x8192 11.2 vs 8.7, 8x16384 11.4 vs 10.1; from 32 chunks the blocks'
// own fill pays: 1x32768 12.4 vs 13.2, 8x32768 12.7 vs 13.6, 1x131072 12.2
// vs 14.1.
constexpr int64_t kFillInBlockMinChunks = 32;

template <typename count_t>
bool fill_table_in_block(int64_t B, int64_t num_chunks) {
  const int64_t wave =
      one_wave_blocks<forward_table_kernel<count_t, 1>>(kRowWarps * 32, kTableSmemBytes);
  return num_chunks >= kFillInBlockMinChunks &&
         table_row_groups(B, num_chunks, kRowWarps, wave) == 1;
}

// The table forward for fill_table_in_block: blocks fill their own slices
// of the table instead of reading prep_and_table_kernel's global one.
// Float32 counts in 16-byte aligned rows: forward_table_fill_ring_kernel, a
// persistent block per SM that also computes alpha's partial totals, so
// that nothing runs before it (GPU time per call against the kernel below
// after alpha_prep_kernel: wide 64x262144 39.7 vs 41.5 us, 40x210000 31.6
// vs 33.1, 32x1048576 100.2 vs 105.2, 32x262144 31.6 vs 31.5, the rows the
// same bits; then with each chunk's log_alpha loaded ahead of its rows:
// 37.1, 29.4, 86.1, 28.7). It finishes its rows itself behind a grid barrier
// (a cooperative launch; finish_rows_kernel where the device cannot run
// one): one launch fewer (fifteenth session, queued, the two alternating in
// one process: 40x210000 30.6 -> 28.1 us, 1x262144 31.1 -> 27.0, 8x262144
// 30.9 -> 27.3, wide 38.7 -> 37.9), the GPU time within 0.5 us (wide 35.6
// -> 36.2, 1x262144 18.1 -> 17.6). Other counts: forward_table_kernel<...,
// kFill>, a block per chunk, each filling its slice while its first row
// loads, as a dependent of alpha_prep_kernel (cols and Apart, needed only
// for rare counts and the finish).
template <typename count_t>
void launch_forward_table_fill(const Tensor& counts, const Tensor& log_alpha, int64_t B,
                               int64_t V, bool normalize, float* out, cudaStream_t stream) {
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const auto* la = static_cast<const float*>(log_alpha.const_data_ptr());
  const int64_t partial_bytes = B * num_chunks * static_cast<int64_t>(sizeof(RowPartial));
  if constexpr (std::is_same_v<count_t, float>) {
    if (aligned && fill_ring_fits()) {
      // One launch that prepares no columns (forward_table_fill_ring_kernel):
      // only the partial totals of alpha, for the finish.
      const int nblk = prep_blocks(V);
      ScratchLayout layout;
      const int64_t apart_at = layout.add(nblk * static_cast<int64_t>(sizeof(double)));
      const int64_t partial_at = layout.add(partial_bytes);
      const Tensor ws = workspace(counts, layout.size());
      auto* Apart = ScratchLayout::at<double>(ws, apart_at);
      RowPartial* partial = ScratchLayout::at<RowPartial>(ws, partial_at);
      constexpr auto kKernel = forward_table_fill_ring_kernel<float>;
      // Fewer chunks than SMs: blocks beside them that only compute alpha's
      // partial totals (a pair of slices each), from the start.
      const int64_t blocks = std::min(num_chunks + ceil_div(nblk, 2),
                                      one_wave_blocks<kKernel>(kRingWarps * 32, kRingSmemBytes));
      const RowOut o{num_chunks, normalize, out, partial};
      if (try_launch_cooperative(kKernel, dim3(static_cast<unsigned>(blocks)),
                                 dim3(kRingWarps * 32), kRingSmemBytes, stream, n, la, Apart,
                                 nblk, B, V, o, true)) {
        return;
      }
      kKernel<<<static_cast<unsigned>(blocks), kRingWarps * 32, kRingSmemBytes, stream>>>(
          n, la, Apart, nblk, B, V, o, false);
      DM_CUDA_CHECK_LAUNCH();
      launch_finish_rows<float>(partial, Apart, nblk, B, 1, num_chunks, false, normalize, out,
                                stream);
      return;
    }
  }
  ScratchLayout layout;
  const int64_t alpha_at = layout.add(prepared_alpha_bytes<float>(1, V));
  const int64_t partial_at = layout.add(partial_bytes);
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<float> pa =
      prepare_alpha<float>(log_alpha, 1, V, ScratchLayout::at<char>(ws, alpha_at), stream);
  RowPartial* partial = ScratchLayout::at<RowPartial>(ws, partial_at);
  const RowOut o{num_chunks, normalize, out, partial};
  // One row in flight per warp: two (the other kernels' choice at these
  // shapes) spilled registers around the fill and took 2.6-11 us longer
  // per call (wide 53.2 vs 46.2, 32x1048576 124.4 vs 113.4, queued).
  constexpr auto kKernel = forward_table_kernel<count_t, 1, true>;
  allow_table_smem<kKernel>(kRowWarps * 32);
  launch_dependent(kKernel, dim3(static_cast<unsigned>(num_chunks)), dim3(kRowWarps * 32),
                   kTableSmemBytes, stream, n, static_cast<const float*>(nullptr), la, pa.cols,
                   pa.Apart, pa.nblk, B, V, aligned, o);
  launch_finish_rows<float>(partial, pa.Apart, pa.nblk, B, 1, num_chunks, false, normalize, out,
                            stream);
}

template <typename count_t>
void launch_forward_table(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                          bool normalize, float* out, cudaStream_t stream) {
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  if (fill_table_in_block<count_t>(B, num_chunks)) {
    launch_forward_table_fill<count_t>(counts, log_alpha, B, V, normalize, out, stream);
    return;
  }
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  const TableForward kind = pick_table_forward<count_t>(B, num_chunks, aligned);
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
  // wave of resident blocks over all chunks; every row's sum is one warp's,
  // in a fixed order, whatever the grid.
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
    case TableForward::kOneRow: {
      constexpr auto kKernel = forward_table_kernel<count_t, 1>;
      launch_rows(integral_constant<decltype(kKernel), kKernel>{});
      break;
    }
  }
  if (num_chunks > 1) {
    launch_finish_rows<float>(partial, pa.Apart, pa.nblk, B, 1, num_chunks, false, normalize, out,
                              stream);
  }
}

// K float32 components over many rows: the component lookup-table kernel,
// then the per-(row, component) finish.
template <typename count_t, int KB>
void launch_components_table(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                             int K, bool normalize, float* out, cudaStream_t stream) {
  constexpr int C = CompSlice<KB>::kCols;
  const int64_t slices = ceil_div(V, C), k_blocks = ceil_div(K, KB);
  ScratchLayout layout;
  const TableScratch<TableKind::kLogPoch, TableLayout::kColumns> tables(layout, K, V);
  const int64_t s_at = layout.add(B * slices * K * static_cast<int64_t>(sizeof(float)));
  const int64_t n_at = layout.add(B * slices * static_cast<int64_t>(sizeof(double2)));
  const Tensor ws = workspace(counts, layout.size());
  const PreparedAlpha<float> pa = tables.prepare(ws, log_alpha, normalize, stream);
  const float* table = tables.table(ws);
  auto* Spart = ScratchLayout::at<float>(ws, s_at);
  auto* Npart = ScratchLayout::at<double2>(ws, n_at);
  const auto* n = static_cast<const count_t*>(counts.const_data_ptr());
  const bool aligned = V % 4 == 0 && is_aligned<count_t>(n);
  // One wave of resident blocks; each group of rows is a fixed range.
  const int64_t wave =
      one_wave_blocks<components_table_forward_kernel<count_t, KB>>(kCompThreads, kCompTableBytes);
  const int64_t groups =
      std::max<int64_t>(1, std::min(ceil_div(B, kCompWarps), wave / (slices * k_blocks)));
  const int64_t rows_per_group = ceil_div(B, groups);
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(ceil_div(B, rows_per_group)),
                  static_cast<unsigned>(k_blocks));
  components_table_forward_kernel<count_t, KB><<<grid, kCompThreads, kCompTableBytes, stream>>>(
      n, table, pa.cols, B, V, K, rows_per_group, aligned, normalize, Spart, Npart);
  DM_CUDA_CHECK_LAUNCH();
  components_finish_kernel<float><<<ceil_div(B * K, 256), 256, 0, stream>>>(
      Spart, Npart, slices, pa.Apart, pa.nblk, B, K, normalize, out);
  DM_CUDA_CHECK_LAUNCH();
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

// Shared alpha: one launch for small problems, else the table path
// (float32, use_tables: from one row) or the math path (float64).
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

// K float32 components where components_per_component (the rule
// components_as_shared_forward, or DIRMULT_CUDA_COMPONENTS): log_lik's
// shared-alpha forward of each component into row k of a (K, B) scratch,
// then out (B, K) is its transpose. Column k is log_lik(counts,
// log_alpha[k]) bit for bit.
template <typename count_t>
void launch_components_as_shared(const Tensor& counts, const Tensor& log_alpha, int64_t B,
                                 int64_t V, int K, bool normalize, Tensor& out,
                                 cudaStream_t stream) {
  Tensor by_component = torch::stable::new_empty(log_alpha, {static_cast<int64_t>(K), B});
  auto* o = static_cast<float*>(by_component.mutable_data_ptr());
  for (int k = 0; k < K; ++k) {
    launch_forward_shared<float, count_t>(counts, row_view(log_alpha, k), B, V,
                                          normalize, o + k * B, stream);
  }
  // (B == 1: the transpose is already contiguous, and no copy is made.)
  out = torch::stable::contiguous(torch::stable::transpose(by_component, 0, 1));
}

// out: a new (B, K) tensor.
template <typename scalar_t, typename count_t>
void launch_forward_components(const Tensor& counts, const Tensor& log_alpha, int64_t B, int64_t V,
                               int K, bool normalize, Tensor& out, cudaStream_t stream) {
  if constexpr (use_tables<scalar_t>()) {
    if (components_per_component(components_as_shared_forward(B, V, K))) {
      launch_components_as_shared<count_t>(counts, log_alpha, B, V, K, normalize, out, stream);
      return;
    }
  }
  out = torch::stable::new_empty(log_alpha, {B, static_cast<int64_t>(K)});
  auto* o = static_cast<scalar_t*>(out.mutable_data_ptr());
  if constexpr (use_tables<scalar_t>()) {
    with_component_block(K, [&](auto kb) {
      launch_components_table<count_t, decltype(kb)::value>(counts, log_alpha, B, V, K, normalize,
                                                            o, stream);
    });
  } else {
    launch_forward_rows<scalar_t, count_t, kComponentBlock>(counts, log_alpha, B, V, K, normalize,
                                                            o, stream);
  }
}

}  // namespace

Tensor log_lik_cuda(Tensor counts, Tensor log_alpha, bool normalize) {
  const bool shared = check_log_alpha(counts, log_alpha);
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

Tensor log_lik_components_cuda(Tensor counts, Tensor log_alpha, bool normalize) {
  check_components(counts, log_alpha);
  torch::stable::accelerator::DeviceGuard guard(counts.get_device_index());
  counts = native_counts(counts);
  log_alpha = as_contiguous(log_alpha);
  const int64_t B = counts.size(0), V = counts.size(1);
  const int K = static_cast<int>(log_alpha.size(0));
  if (B == 0 || V == 0 || K == 0) {
    return torch::stable::new_zeros(log_alpha, {B, static_cast<int64_t>(K)});
  }
  const cudaStream_t stream = current_stream(counts.get_device_index());
  Tensor out;
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    DM_DISPATCH_NATIVE_COUNTS(counts.scalar_type(), [&] {
      launch_forward_components<scalar_t, count_t>(counts, log_alpha, B, V, K, normalize, out,
                                                    stream);
    });
  });
  return out;
}

}  // namespace cuda
}  // namespace dirmult
