// The tables' entries (See Note [Tables]): prep_and_table_kernel fills a
// global table in the launch that prepares alpha; fill_table_slice fills a
// block's own slice in shared memory, the same entries bit for bit.
#pragma once

#include <cstdint>

#include "alpha_prep.cuh"
#include "table_layout.cuh"
#include "warp_reduce.cuh"
#include "dependent_launch.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// The table fill's latency is on every table kernel's critical path: a
// thread per entry (column, n) where the columns are few, a thread per
// column (16 dependent steps) where they are many (BENCHMARKS.md).
constexpr int64_t kEntryThreadsMaxColumns = 4096;

__host__ __device__ inline bool table_fill_per_entry(int64_t padded_columns) {
  return padded_columns <= kEntryThreadsMaxColumns;
}

inline int64_t table_fill_blocks(int64_t padded_columns) {
  return ceil_div(padded_columns * (table_fill_per_entry(padded_columns) ? kTableWidth : 1),
                  kPrepThreads);
}

// Stores table entries of one column: entry n at dst[n * kStride], and for
// kBoth the alpha dpoch table's at dst2[n * kStride]. The kind and layout
// are template arguments so that the fill's unrolled loop has no branch on
// them and its stores constant offsets. log n! (normalize) comes from
// log_fact, the block's copy of log_factorial(0 .. kMaxExactCount) (the same
// bits as the log of run.fact: the same products), not a log per entry.
template <TableKind kKind, TableLayout kLayout>
struct TableEntryWriter {
  static constexpr int64_t kStride = kLayout == TableLayout::kChunkSlots ? kTableChunk : 1;
  float* dst;
  float* dst2;  // kBoth only
  bool normalize;
  const float* log_fact;

  __device__ __forceinline__ void zero(int n) const {
    dst[n * kStride] = 0.0f;
    if constexpr (kKind == TableKind::kBoth) dst2[n * kStride] = 0.0f;
  }

  // lnpoch entry n of the column whose entries start at d, from its value r.
  __device__ __forceinline__ void put_lnpoch(float* d, int n, float r) const {
    d[n * kStride] = normalize ? r - log_fact[n] : r;
  }

  // Entry n from the running products after factors 1 .. n - 1, except an
  // lnpoch entry that cancels (lnpoch_exact_cancels): that one is left
  // unstored, for refine(), and store() returns true.
  __device__ __forceinline__ bool store(const ExactRun<float>& run, const ExactFactors<float>& f,
                                        float a, float la, int n) const {
    if (n == 0) {
      zero(0);
      return false;
    }
    if constexpr (kKind == TableKind::kBoth) {
      dst2[n * kStride] = exact_run_value(run, f, a, la, n, false, false);
    }
    if constexpr (kKind == TableKind::kAlphaDPoch) {
      dst[n * kStride] = exact_run_value(run, f, a, la, n, false, false);
      return false;
    } else {
      const float r = exact_run_lnpoch(run, f, la, n);
      if (lnpoch_exact_cancels(la, n, r)) return true;
      put_lnpoch(dst, n, r);
      return false;
    }
  }

  // The cancelling lnpoch entry n of the column whose entries start at d.
  __device__ __forceinline__ void refine(float* d, float la, int n) const {
    put_lnpoch(d, n, static_cast<float>(lnpoch_exact_refined(static_cast<double>(la), n)));
  }
};

// The float64 refinements a warp's columns left (bit n of redo: entry n of
// the lane's column, entries from w.dst, log_alpha la), spread over the
// warp's lanes, not run for the whole warp, diverged, per n (See Note
// [Float64 redo]). Warp-uniform call; queue holds 32 * kTableWidth entries.
template <typename Writer>
__device__ __forceinline__ void refine_queued(const Writer& w, float la, unsigned redo,
                                              uint16_t* queue) {
  const int lane = threadIdx.x & 31;
  const int mine = __popc(redo);
  const int end = warp_inclusive_scan(mine, lane);
  const int total = __shfl_sync(0xffffffffu, end, 31);
  if (total == 0) return;
  for (int i = end - mine; redo != 0; ++i) {
    const int n = __ffs(static_cast<int>(redo)) - 1;
    redo &= redo - 1;
    queue[i] = static_cast<uint16_t>(lane * 32 + n);
  }
  __syncwarp();
  const auto dst = reinterpret_cast<unsigned long long>(w.dst);
  for (int i0 = 0; i0 < total; i0 += 32) {
    const int i = i0 + lane;
    const int e = i < total ? queue[i] : 0;
    const int src = e >> 5;
    const float l = __shfl_sync(0xffffffffu, la, src);
    auto* d = reinterpret_cast<float*>(__shfl_sync(0xffffffffu, dst, src));
    if (i < total) w.refine(d, l, e & 31);
  }
}

// Entries 0 .. kTableWidth - 1 of one column of log_alpha la through w,
// unrolled so that n is a constant in each step (a rolled loop made the wide
// two-table fill slower, BENCHMARKS.md). Returns the entries left for
// refine_queued (bit n).
template <typename Writer>
__device__ __forceinline__ unsigned fill_table_column(const Writer& w, float la) {
  const float a = dm_exp(la);
  const ExactFactors<float> f = exact_factors(a);
  ExactRun<float> run;  // after factors 1 .. n - 1 for entry n
  unsigned redo = 0;
#pragma unroll
  for (int n = 0; n < kTableWidth; ++n) {
    if (w.store(run, f, a, la, n)) redo |= 1u << n;
    if (n > 0) exact_run_step(f, n, run);
  }
  return redo;
}

// One launch for both: blocks [0, K nblk) prepare alpha (prep_alpha_slice),
// the rest fill the table of the K * V columns (table_fill_per_entry): lnpoch
// (minus log n! when normalized) or alpha dpoch, from the exact path's
// running products (math.h: the same multiplications as lnpoch_exact and
// adpoch_exact, so the same values); for kBoth both tables. For
// kChunkSlots, consecutive threads take consecutive slots of one n, so every
// store is coalesced.
template <TableKind kKind, TableLayout kLayout>
__global__ void __launch_bounds__(kPrepThreads)
    prep_and_table_kernel(const float* __restrict__ log_alpha, int64_t V, int K, int nblk,
                          ColumnAlpha<float>* __restrict__ cols, double* __restrict__ Apart,
                          bool normalize, float* __restrict__ table, int64_t padded_columns) {
  allow_dependent_launch();  // the table kernel's launch overlaps this one
  const int64_t prep_blocks_total = static_cast<int64_t>(nblk) * K;
  if (blockIdx.x < prep_blocks_total) {
    prep_alpha_slice<float>(log_alpha, V, static_cast<int>(blockIdx.x / nblk),
                            static_cast<int>(blockIdx.x % nblk), nblk, cols, Apart);
    return;
  }
  __shared__ float log_fact[kTableWidth];
  if (normalize && threadIdx.x < kTableWidth) {
    log_fact[threadIdx.x] = log_factorial(static_cast<float>(threadIdx.x));
  }
  __syncthreads();
  const int64_t i = (blockIdx.x - prep_blocks_total) * kPrepThreads + threadIdx.x;
  const bool per_entry = table_fill_per_entry(padded_columns);
  const int n_entry = per_entry ? static_cast<int>(i / padded_columns) : 0;
  const int64_t slot = per_entry ? i - n_entry * padded_columns : i;
  // Threads past the table stay (idle) for the warp's refine_queued.
  const bool live = slot < padded_columns && n_entry < kTableWidth;
  int64_t column, first;  // entry (column, n) is table[first + n * kStride]
  if constexpr (kLayout == TableLayout::kChunkSlots) {
    const int64_t chunk = slot / kTableChunk;
    const int p = static_cast<int>(slot - chunk * kTableChunk);  // = table_slot(v, 0) of column v
    column = chunk * kTableChunk + (p % (kTableChunk / 4)) * 4 + p / (kTableChunk / 4);
    first = chunk * kChunkFloats + p;
  } else {
    column = slot;
    first = slot * kTableWidth;
  }
  using Writer = TableEntryWriter<kKind, kLayout>;
  Writer w{table + first, nullptr, normalize, log_fact};
  if constexpr (kKind == TableKind::kBoth) w.dst2 = w.dst + padded_columns * kTableWidth;
  const bool padding = column >= K * V;  // read as count 0 only
  const float la = live && !padding ? log_alpha[column] : 0.0f;
  if (per_entry) {
    // A warp's entries share n: its refinements diverge only between lanes.
    if (!live) return;
    if (padding) return w.zero(n_entry);
    const float a = dm_exp(la);
    const ExactFactors<float> f = exact_factors(a);
    ExactRun<float> run;  // after factors 1 .. n_entry - 1
#pragma unroll 1
    for (int k = 1; k < n_entry; ++k) exact_run_step(f, k, run);
    if (w.store(run, f, a, la, n_entry)) w.refine(w.dst, la, n_entry);
    return;
  }
  // A thread per column.
  unsigned redo = 0;  // bit n: entry n left for refine_queued
  if (live) {
    if (padding) {
#pragma unroll
      for (int n = 0; n < kTableWidth; ++n) w.zero(n);
    } else {
      redo = fill_table_column(w, la);
    }
  }
  __shared__ uint16_t queue[kPrepThreads / 32][32 * kTableWidth];
  refine_queued(w, la, redo, queue[threadIdx.x >> 5]);
}

// The entries of slot p of a slice tab (in shared memory; kBoth: the alpha
// dpoch slice follows it, as second_table's) from la, the
// log_alpha of its column (in: the column is inside V; else zeros), the
// same code per column as prep_and_table_kernel's kChunkSlots fill (so the
// same entries, bit for bit); log_fact: log_factorial(0 .. kMaxExactCount)
// when normalize, queue: the warp's refinement queue. Warp-uniform call.
template <TableKind kKind = TableKind::kLogPoch>
__device__ __forceinline__ void fill_slice_slot(float* __restrict__ tab, int p, float la, bool in,
                                                bool normalize, const float* log_fact,
                                                uint16_t* queue) {
  static_assert(kKind != TableKind::kAlphaDPoch, "slices of lnpoch, or of both");
  using Writer = TableEntryWriter<kKind, TableLayout::kChunkSlots>;
  Writer w{tab + p, nullptr, normalize, log_fact};
  if constexpr (kKind == TableKind::kBoth) w.dst2 = tab + kChunkFloats + p;
  unsigned redo = 0;
  if (in) {
    redo = fill_table_column(w, la);
  } else {
#pragma unroll
    for (int n = 0; n < kTableWidth; ++n) w.zero(n);
  }
  refine_queued(w, la, redo, queue);
  __syncwarp();  // the queue is reused by the next slot
}

// The log_alpha of a thread's slots of chunk c's slice (slots threadIdx.x
// + kThreads i; 0 past V), loaded ahead of the slice's fill: a kernel issues
// these before the rows it streams, so that they are not served behind
// those (fill_table_slice).
template <int kThreads>
struct SliceAlpha {
  static constexpr int kSlots = kTableChunk / kThreads;
  float la[kSlots];

  __device__ __forceinline__ void load(const float* __restrict__ log_alpha, int64_t V,
                                       int64_t c) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int64_t v = c * kTableChunk + slice_column(threadIdx.x + kThreads * i);
      la[i] = v < V ? log_alpha[v] : 0.0f;
    }
  }
};

// Chunk c's table slice (kBoth: both slices, lnpoch's then alpha dpoch's),
// filled by the calling block itself into tab from
// its log_alpha (SliceAlpha::load, by every thread), kTableChunk / kThreads
// slots per thread (fill_slice_slot); returns after a __syncthreads. For
// kernels whose grid has one block per chunk: there the global table would
// be filled once and read once, and its fill serialized before every
// block's count stream.
template <int kThreads, TableKind kKind = TableKind::kLogPoch>
__device__ __forceinline__ void fill_table_slice(float* __restrict__ tab,
                                                 const SliceAlpha<kThreads>& alpha, int64_t V,
                                                 int64_t c, bool normalize) {
  static_assert(kTableChunk % kThreads == 0 && kThreads % 32 == 0, "warp-uniform columns");
  __shared__ float log_fact[kTableWidth];
  __shared__ uint16_t queue[kThreads / 32][32 * kTableWidth];
  if (normalize && threadIdx.x < kTableWidth) {
    log_fact[threadIdx.x] = log_factorial(static_cast<float>(threadIdx.x));
  }
  __syncthreads();
  // A rolled loop over the slots (the fill of one is long), the loaded
  // values shifted down one register a step.
  SliceAlpha<kThreads> next = alpha;
#pragma unroll 1
  for (int p = threadIdx.x; p < kTableChunk; p += kThreads) {
    const float la = next.la[0];
#pragma unroll
    for (int i = 0; i + 1 < SliceAlpha<kThreads>::kSlots; ++i) next.la[i] = next.la[i + 1];
    fill_slice_slot<kKind>(tab, p, la, c * kTableChunk + slice_column(p) < V, normalize,
                           log_fact, queue[threadIdx.x >> 5]);
  }
  __syncthreads();
}

}  // namespace cuda
}  // namespace dirmult
