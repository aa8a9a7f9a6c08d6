// Lookup-table kernels for a shared concentration vector and many rows.
//
// Counts are mostly small integers, and with alpha shared by every row the
// terms lnpoch(alpha_v, n) and alpha_v dpoch(alpha_v, n) take only
// kTableWidth values per column. prep_and_table_kernel evaluates them once
// per call (with the full-accuracy math, in the launch that prepares alpha),
// and the count kernels replace the per-element products and logs by a
// shared-memory lookup, which keeps them memory-bound. Counts that are not
// small integers take the math path.
#pragma once

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "alpha_prep.cuh"
#include "cuda_utils.cuh"
#include "dirmult/math.h"
#include "forward_kernels.cuh"
#include "ops_cuda.h"

namespace dirmult {
namespace cuda {

constexpr int kTableChunk = 1024;                // columns per block (smem slice)
constexpr int kTableUnroll = 8;                  // 16-byte loads in flight per lane
constexpr size_t kTableSmemBytes = kTableChunk * kTableWidth * sizeof(float);
// A lane's unrolled loads (or two halves of them) cover a whole chunk, so
// every column a lane touches is inside the chunk's table slice.
static_assert(kTableUnroll * 128 == kTableChunk, "a warp's unrolled loads span one chunk");

// The table paths are float32 only (a float64 table would not fit the
// shared memory of a 1024-column block). On the GPU they pay from one row,
// though an entry costs about one direct evaluation and is used by about
// B / kTableWidth rows: the math path runs each warp's lanes in lockstep
// through the longest product, its log and the float64 redo of any
// cancelling term, a row per warp, latency-bound with few rows, where a
// table entry is ~40 branch-free instructions filled by a thread per
// column. GPU time per call (fourteenth session, BENCHMARKS.md), math path
// -> tables: forward 1x262144 39.8 -> 18.6 us, 31x262144 128.6 -> 25.6,
// 8x2048 35.0 -> 11.9; forward+backward 31x262144 308.3 -> 71.1 (53.6
// with the single pass from one row), 8x300 44.6 -> 30.3. (They were
// taken from 32 rows before.) Except the components' backward: its two
// tables over K V columns, filled before its column pass, cost more than
// few rows' math path (K = 4, 1x50000: ~201 vs ~35 us), so it takes them
// from kComponentBackwardTableMinRows.
constexpr int64_t kComponentBackwardTableMinRows = 32;

template <typename scalar_t>
constexpr bool use_tables() {
  return std::is_same_v<scalar_t, float>;
}

// Raises a table kernel's dynamic shared-memory limit to `bytes`, once per
// device (the attribute is per device), and returns how many of its blocks of
// `threads` fit on one SM, so grids can be sized to whole waves. The kernel
// is a template argument so that each kernel has its own cache (kernels of
// the same signature share a function type).
template <auto kKernel>
int allow_table_smem(int threads, size_t bytes = kTableSmemBytes) {
  static int blocks_per_sm[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (blocks_per_sm[dev] > 0) return blocks_per_sm[dev];
  cudaError_t err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes));
  STD_TORCH_CHECK(err == cudaSuccess, "dirmult: cannot use ", bytes,
                  " bytes of shared memory: ", cudaGetErrorString(err));
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, threads, bytes);
  STD_TORCH_CHECK(err == cudaSuccess, "dirmult: occupancy query failed: ", cudaGetErrorString(err));
  blocks_per_sm[dev] = std::max(blocks, 1);
  return blocks_per_sm[dev];
}

// Blocks of `threads` (and `bytes` of dynamic shared memory) resident on the
// whole GPU at once: grids of this many blocks run in one wave (a second,
// partial wave would double the time of the rows it holds).
template <auto kKernel>
int64_t one_wave_blocks(int threads, size_t bytes) {
  return static_cast<int64_t>(allow_table_smem<kKernel>(threads, bytes)) * num_sms();
}

// kBoth: the lnpoch table, then the alpha dpoch table (second_table).
enum class TableKind { kLogPoch, kAlphaDPoch, kBoth };

// kChunkSlots (shared alpha): per chunk of kTableChunk columns, the
// kChunkFloats entries in their shared-memory order (table_slot), columns
// past the end 0, so a block stages its slice with straight 16-byte copies.
// kColumns (components): entry (column, n) at column * kTableWidth + n.
enum class TableLayout { kChunkSlots, kColumns };

constexpr int kChunkFloats = kTableChunk * kTableWidth;

// Columns of the table, padded to whole chunks for kChunkSlots.
inline int64_t table_columns(int64_t columns, TableLayout layout) {
  return layout == TableLayout::kChunkSlots ? ceil_div(columns, kTableChunk) * kTableChunk
                                            : columns;
}

inline int64_t table_bytes(int64_t columns, TableLayout layout,
                           TableKind kind = TableKind::kLogPoch) {
  const int64_t tables = kind == TableKind::kBoth ? 2 : 1;
  return tables * table_columns(columns, layout) * kTableWidth *
         static_cast<int64_t>(sizeof(float));
}

// The alpha dpoch table of a kBoth table of `columns` columns.
__host__ __device__ inline float* second_table(float* table, int64_t columns, TableLayout layout) {
  const int64_t padded = layout == TableLayout::kChunkSlots
                             ? (columns + kTableChunk - 1) / kTableChunk * kTableChunk
                             : columns;
  return table + padded * kTableWidth;
}

// The table fill's latency is on every table kernel's critical path. A
// thread per entry (column, n) where the columns are few: tall's 1024
// columns took 4.2 us a thread per column (16 dependent steps with a log
// each, on 4 blocks), 2.6 us a thread per entry. A thread per column where
// they are many: wide's 262144 took 16.7 us that way and 53.6 us a thread
// per entry (17 times the threads, each redoing the running products).
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
// warp's lanes: in the column loop each n's refinement ran for the whole
// warp, diverged (queued: wide forward 59.2 -> 57.5 us, forward+backward
// 270.6 -> 256.4, 40x210000 forward 45.6 -> 43.3; the rows are the same
// bits). Warp-uniform call; queue holds 32 * kTableWidth entries.
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
// two-table fill 17.7 -> 23.7 us). Returns the entries left for
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

// Starts copying chunk c's slice of a kChunkSlots table into shared memory:
// 16-byte asynchronous copies, all in flight at once (a load-then-store loop
// waits for the L2 once per iteration: tens of microseconds per kernel), as
// one committed group of the calling thread's copies.
__device__ __forceinline__ void issue_table_slice(float* __restrict__ tab,
                                                  const float* __restrict__ table, int64_t c) {
  static_assert(kChunkFloats % 4 == 0, "a slice is whole 16-byte vectors");
  const float4* src = reinterpret_cast<const float4*>(table + c * kChunkFloats);
  float4* dst = reinterpret_cast<float4*>(tab);
  for (int i = threadIdx.x; i < kChunkFloats / 4; i += blockDim.x) {
    __pipeline_memcpy_async(dst + i, src + i, sizeof(float4));
  }
  __pipeline_commit();
}

// issue_table_slice, then waits for the copies and syncs the block.
__device__ __forceinline__ void stage_table_slice(float* __restrict__ tab,
                                                  const float* __restrict__ table, int64_t c) {
  issue_table_slice(tab, table, c);
  __pipeline_wait_prior(0);
  __syncthreads();
}

// The column of its chunk whose entries slot p of a kChunkSlots slice holds:
// (p % (kTableChunk / 4)) * 4 + p / (kTableChunk / 4) (table_slot(v, 0) = p).
__device__ __forceinline__ int slice_column(int p) {
  return (p % (kTableChunk / 4)) * 4 + p / (kTableChunk / 4);
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

// Whether n is an integer in [0, kMaxExactCount], and if so, idx = n (else
// idx is garbage). Float adds instead of F2I/I2F: those conversions run at a
// quarter of the FP32 rate and were two per count in the hot loops. n + 2^23
// rounds n to an integer in the low mantissa bits when 0 <= n < 2^23 (the
// bits then read 0x4B000000 + n); subtracting 2^23 back gives n exactly iff
// n was an integer. A negative n, one of 2^23 or more, or +inf lands outside
// [0, kMaxExactCount] after the bias; NaN fails the comparison. (The _rn
// intrinsics are never contracted or reassociated.)
__device__ __forceinline__ bool table_index(float n, int& idx) {
  constexpr float kTwo23 = 8388608.0f;
  const float t = __fadd_rn(n, kTwo23);
  idx = __float_as_int(t) - 0x4B000000;
  return static_cast<unsigned>(idx) <= static_cast<unsigned>(kMaxExactCount) &&
         __fsub_rn(t, kTwo23) == n;
}

// Shared-memory position of (column v of the chunk, count n): n-major, and
// within an n-row column v sits at (v % 4) * (chunk / 4) + v / 4, so the 32
// lanes of a warp, each reading 4 consecutive columns, hit 32 different banks
// for every j, whatever counts they hold.
__device__ __forceinline__ int table_slot(int v, int n) {
  return n * kTableChunk + (v & 3) * (kTableChunk / 4) + (v >> 2);
}

// A warp's rows in forward_table_kernel, one after the other: add()
// reduces a row's sums over the warp; with one chunk per row, lane i % 32
// keeps the warp's i-th row and finishes it (float64 lnpoch(A, N)) once 32
// rows are in, so that the finish runs for 32 rows at once, and flush()
// finishes the rest; with several chunks, lane 0 writes the chunk's partial.
// Warp-uniform calls only. The kernel's parameters (RowOut) are passed to
// each call rather than kept in the writer: read from the constant bank
// where needed, they hold no registers in the hot loops.
struct RowOut {
  int64_t num_chunks;
  bool normalize;
  float* __restrict__ out;
  RowPartial* __restrict__ partial;
};

struct TableRowWriter {
  int64_t my_b = -1;
  double my_s = 0.0, my_N = 0.0, my_norm = 0.0;
  int i = 0;

  // s: the lane's lnpoch sum; table_N its table counts (exact integers),
  // rare_N and norm its off-table counts and -log n! terms; ok: no bad count.
  // c: the chunk (with several, the partial's column).
  __device__ __forceinline__ void add(const RowOut& o, double A, int64_t b, int64_t c, bool valid,
                                      double s, int table_N, double rare_N, double norm, bool ok) {
    const int lane = threadIdx.x & 31;
    s = warp_allsum(s);
    double N = static_cast<double>(__reduce_add_sync(0xffffffffu, table_N));
    if (__any_sync(0xffffffffu, rare_N != 0.0 || norm != 0.0)) {
      N += warp_allsum(rare_N);
      norm = warp_allsum(norm);
    }
    if (!__all_sync(0xffffffffu, ok)) s = NAN;
    if (!valid) return;
    if (o.num_chunks > 1) {
      if (lane == 0) o.partial[b * o.num_chunks + c] = {s, N, norm, 0.0};
      return;
    }
    if ((i & 31) == lane) my_b = b, my_s = s, my_N = N, my_norm = norm;
    if ((i & 31) == 31) flush(o, A);
    ++i;
  }

  __device__ __forceinline__ void flush(const RowOut& o, double A) {
    if (my_b >= 0) {
      o.out[my_b] = static_cast<float>(finish_row(my_s, my_N, my_norm, A, o.normalize));
    }
    my_b = -1;
  }
};

// The lane's 4 * kUnroll counts from column v0 + base of rows b0 + r * stride
// (r < kRows); rows past B read as zeros.
template <typename count_t, int kRows, int kUnroll>
__device__ __forceinline__ void load_table_batch(const count_t* __restrict__ counts, int64_t b0,
                                                 int64_t stride, int64_t B, int64_t V, int64_t v0,
                                                 int base, int len, bool aligned,
                                                 float4 (&n)[kRows][kUnroll]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const count_t* row = counts + (b0 + r * stride) * V + v0;
    const bool in = b0 + r * stride < B;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[4];
      double unused[4];
      load_counts<float, count_t>(row, base + 128 * u, in ? len : 0, aligned, x, unused);
      n[r][u] = make_float4(x[0], x[1], x[2], x[3]);
    }
  }
}

__device__ __forceinline__ float float4_at(const float4& x, int j) {
  return j == 0 ? x.x : j == 1 ? x.y : j == 2 ? x.z : x.w;
}

// The float at a 32-bit shared-memory address. Volatile: it reads memory the
// compiler does not see, so it must stay between the barriers around it.
__device__ __forceinline__ float load_shared_float(unsigned at) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(at));
  return v;
}

// The 32-bit shared address of table_slot(v, n) + offset, from slot_at, the
// address of table_slot(v, 0): the lookups' address is one IMAD per count,
// the rest an immediate offset of the load (through a float* the compiler
// formed the element index with an IMAD, then scaled it and added the base
// with a LEA).
__device__ __forceinline__ unsigned table_entry_at(unsigned slot_at, int n, int offset) {
  return slot_at + static_cast<unsigned>(n) * (kTableChunk * sizeof(float)) +
         static_cast<unsigned>(offset) * sizeof(float);
}

// Adds a lane's kUnroll vectors of counts n (columns base + 128 u + j of
// the chunk) from the chunk's table slice, tq = slice + base / 4: s += the
// terms (at most 4 in float, then into the double sum), table_N += the
// table indices. Returns the counts off the table (bit 4 u + j), which
// looked up entry 0 (= 0) instead.
template <int kUnroll>
__device__ __forceinline__ unsigned add_table_terms(const float4 (&n)[kUnroll],
                                                    const float* __restrict__ tq, double& s,
                                                    int& table_N) {
  unsigned rare = 0;
  // table_slot(base + 128 u + j, n) = n * kTableChunk + j * (kTableChunk / 4) + base / 4 + 32 u,
  // read through tq's 32-bit shared address (table_entry_at).
  const unsigned tq_at = static_cast<unsigned>(__cvta_generic_to_shared(tq));
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float part = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int idx;
      const bool hit = table_index(float4_at(n[u], j), idx);
      idx = hit ? idx : 0;
      rare |= hit ? 0u : 1u << (4 * u + j);
      table_N += idx;
      part += load_shared_float(table_entry_at(tq_at, idx, j * (kTableChunk / 4) + 32 * u));
    }
    s += static_cast<double>(part);
  }
  return rare;
}

// The prepared columns of a chunk made where they are needed, from log_alpha
// (at the chunk's first column), for kernels that do not wait for
// alpha_prep_kernel's: the same bits (column_alpha).
struct ColumnsFromLogAlpha {
  const float* __restrict__ log_alpha;
  __device__ __forceinline__ ColumnAlpha<float> operator[](int v) const {
    return column_alpha(log_alpha[v]);
  }
};

// The math path's value of an off-table count: its term, the count (NaN
// for a bad count) and -log n!.
struct RareTerm {
  double lnpoch, n, norm;
};

// The RareTerm of count c; lnpoch_of(x) gives its term at x = float(c),
// called only for a valid count.
template <typename count_t, typename LnPoch>
__device__ __forceinline__ RareTerm rare_term(count_t c, bool normalize, LnPoch lnpoch_of) {
  const float x = static_cast<float>(c);
  if (!is_valid_count(x)) return RareTerm{0.0, NAN, 0.0};
  return RareTerm{static_cast<double>(lnpoch_of(x)), static_cast<double>(c),
                  normalize ? -static_cast<double>(log_factorial(x)) : 0.0};
}

__device__ __forceinline__ void add_rare_term(const RareTerm& t, bool normalize, double& s,
                                              double& rare_N, double& norm, bool& ok) {
  if (t.n != t.n) {  // a bad count
    ok = false;
    return;
  }
  rare_N += t.n;
  s += t.lnpoch;
  if (normalize) norm += t.norm;
}

// Non-integer, large or bad counts (add_table_terms's marks, the lane's
// columns base + 128 (e / 4) + e % 4 for bit e, base = 4 lane + a
// warp-uniform offset; row and cols at the chunk's first column: prepared
// columns, or ColumnsFromLogAlpha) take the math path, spread over the
// warp's lanes (spread_marks): one copy of it, out of the unrolled loop, so
// that the hot loop's code stays small (a copy per unrolled element
// overflowed the instruction cache). Warp-uniform call.
template <typename count_t, typename Columns>
__device__ __forceinline__ void add_rare_terms(unsigned rare, const count_t* __restrict__ row,
                                               int base, const Columns cols, bool normalize,
                                               double& s, double& rare_N, double& norm, bool& ok) {
  if (!__any_sync(0xffffffffu, rare != 0)) return;
  const int lane = threadIdx.x & 31;
  auto compute = [&](int owner, int e) {
    const int v = base + 4 * (owner - lane) + 128 * (e >> 2) + (e & 3);
    return rare_term(row[v], normalize, [&](float x) {
      const ColumnAlpha<float> col = cols[v];
      return lnpoch(col.factors(), col.a, col.log_a, x);
    });
  };
  auto consume = [&](int, const RareTerm& t) { add_rare_term(t, normalize, s, rare_N, norm, ok); };
  spread_marks<RareTerm>(rare, compute, consume);
}

// Forward with the table: grid (column chunks, row groups), a warp per row.
// Each block holds its chunk's slice of the table in shared memory. The
// per-row float64 finish (lnpoch(A, N), log N!) is done for 32 rows at once,
// a row per lane, instead of by lane 0 alone.
//
// The hot loop is branch-free: a zero count looks up entry 0 (which is 0),
// the table index of a count off the table is replaced by 0 and the count is
// marked rare; N sums the table indices as integers (one warp reduction
// instruction per row) and the rare counts exactly, in float64. Validity
// needs checking only for rare counts (every table index is a valid count).
//
// kRows rows per warp are in flight at once (their loads are all issued
// before any is used): more bytes in flight per SM at fewer resident blocks.
//
// Launched as a dependent of prep_and_table_kernel (launch_dependent), so its
// launch overlaps the table's preparation. (Prefetching the first rows to L2
// before the wait was measured slower: tall 81.5 us with 4 rows per warp,
// 80.6 with 2, 79.5 with none.)
//
// kFill: the block fills its table slice itself from log_alpha
// (fill_table_slice; `table` is unused) while its first rows' loads are in
// flight, and the kernel waits for the prior grid (alpha_prep_kernel: cols
// and Apart) only after that, so the fill overlaps both.
template <typename count_t, int kRows, bool kFill = false>
__global__ void __launch_bounds__(kRowWarps * 32, kRows == 1 && !kFill ? 3 : 2)
    forward_table_kernel(const count_t* __restrict__ counts, const float* __restrict__ table,
                         const float* __restrict__ log_alpha,
                         const ColumnAlpha<float>* __restrict__ cols,
                         const double* __restrict__ Apart, int nblk_alpha, int64_t B, int64_t V,
                         bool aligned, const RowOut o) {
  const bool normalize = o.normalize;
  // 8-byte counts: half the loads in flight, or their registers spill.
  constexpr int kUnroll = sizeof(count_t) > 4 ? kTableUnroll / 2 : kTableUnroll;
  extern __shared__ float tab[];
  const int64_t c = blockIdx.x;
  const int64_t v0 = c * kTableChunk;
  const int len = static_cast<int>(min(V - v0, static_cast<int64_t>(kTableChunk)));
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kRowWarps;  // between a warp's rows
  // A warp's steps: kRows rows (b0) by pieces of kUnroll * 128 columns
  // (warp-uniform: lanes past len load zeros, entry 0).
  const int pieces = (len + 128 * kUnroll - 1) / (128 * kUnroll);
  int64_t b0 = static_cast<int64_t>(blockIdx.y) * kRowWarps + warp;
  int piece = 0;
  float4 n[kRows][kUnroll];
  // Columns past V read as count 0: entry 0 (= 0).
  if constexpr (kFill) {
    SliceAlpha<kRowWarps * 32> alpha;
    alpha.load(log_alpha, V, c);  // (before the rows: not served behind them)
    load_table_batch<count_t, kRows, kUnroll>(counts, b0, stride, B, V, v0, 4 * lane, len,
                                              aligned, n);
    fill_table_slice(tab, alpha, V, c, normalize);
    wait_for_prior_grid();
  } else {
    wait_for_prior_grid();
    stage_table_slice(tab, table, c);
  }
  const double A = alpha_total(Apart, 0, nblk_alpha);
  TableRowWriter writer;
  double s[kRows], rare_N[kRows], norm[kRows];
  int table_N[kRows];  // at most kMaxExactCount per column: no overflow
  bool ok[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) s[r] = rare_N[r] = norm[r] = 0.0, table_N[r] = 0, ok[r] = true;
  while (b0 < B) {
    const int base = piece * (128 * kUnroll) + 4 * lane;
    if constexpr (!kFill) {  // (kFill: loaded after the previous step)
      load_table_batch<count_t, kRows, kUnroll>(counts, b0, stride, B, V, v0, base, len, aligned,
                                                n);
    }
    const float* tq = tab + (base >> 2);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const unsigned rare = add_table_terms<kUnroll>(n[r], tq, s[r], table_N[r]);
      add_rare_terms(rare, counts + (b0 + r * stride) * V + v0, base, cols + v0, normalize, s[r],
                     rare_N[r], norm[r], ok[r]);
    }
    if (++piece == pieces) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t b = b0 + r * stride;
        writer.add(o, A, b, c, b < B, s[r], table_N[r], rare_N[r], norm[r], ok[r]);
        s[r] = rare_N[r] = norm[r] = 0.0, table_N[r] = 0, ok[r] = true;
      }
      piece = 0;
      b0 += kRows * stride;
    }
    if constexpr (kFill) {
      if (b0 < B) {
        load_table_batch<count_t, kRows, kUnroll>(counts, b0, stride, B, V, v0,
                                                  piece * (128 * kUnroll) + 4 * lane, len,
                                                  aligned, n);
      }
    }
  }
  writer.flush(o, A);
}

// Forward with the table for float32 counts in 16-byte aligned rows, many of
// them (tall): a warp's rows go through a ring of kRingSlots row slots in
// shared memory, filled by asynchronous 16-byte copies (cp.async) that each
// lane issues for its own vectors and waits for itself, so that the warp's
// next row is in flight while it looks up the current one, without holding
// registers (forward_table_kernel holds its rows in flight in registers, and
// only while it waits for them). One block of kRingWarps warps per SM: the
// table slice and the rings fill the shared memory. Tall forward kernel
// 73.3 -> 67.5 us (12 warps x 3 slots 68.6, 8 x 4 68.4); the same sums in
// the same order as forward_table_kernel.
constexpr int kRingWarps = 16;
constexpr int kRingSlots = 2;
constexpr size_t kRingSmemBytes =
    kTableSmemBytes + static_cast<size_t>(kRingWarps) * kRingSlots * kTableChunk * sizeof(float);
// The static shared memory of forward_table_fill_ring_kernel: its fill's
// queues and log n!, its alpha slices' warp totals.
constexpr size_t kRingFillStaticBytes =
    kRingWarps * 32 * kTableWidth * sizeof(uint16_t) + kTableWidth * sizeof(float) +
    2 * (kPrepThreads / 32) * (sizeof(double) + sizeof(int));
constexpr int kRingSlotVectors = kTableChunk / 4;  // 16-byte vectors per slot: a row's chunk

// Starts the calling lane's 16-byte copies of a row's chunk (row: its first
// column, len columns, 16-byte aligned; V % 4 == 0, so whole vectors) into
// a ring slot: vectors lane + 32 u, those past len zero-filled. One commit
// group per call, an empty one for a null row, so that a lane's groups in
// flight always count the same rows.
__device__ __forceinline__ void issue_ring_row(float4* __restrict__ slot,
                                               const float* __restrict__ row, int len, int lane) {
  if (row != nullptr) {
    // One LDGSTS per vector: the vector offset is an immediate and "past the
    // row" is the copy's ignore-src predicate (the slot gets zeros, the source
    // is not read), where __pipeline_memcpy_async made each a predicated pair
    // with selected addresses. An ignored source may lie past the row.
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(slot + lane));
    const float4* src = reinterpret_cast<const float4*>(row) + lane;
    const int first = 4 * lane;  // the lane's first count in vector 0
    static_assert(kTableUnroll == 8, "one copy per 512-byte step below");
#define DIRMULT_RING_COPY(OFF)                                               \
    asm volatile(                                                            \
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t"                   \
        "cp.async.cg.shared.global [%0+" #OFF "], [%1+" #OFF "], 16, p;\n\t}" \
        :: "r"(dst), "l"(src), "r"(static_cast<int>(first + (OFF) / 4 >= len))  \
        : "memory")
    DIRMULT_RING_COPY(0);
    DIRMULT_RING_COPY(512);
    DIRMULT_RING_COPY(1024);
    DIRMULT_RING_COPY(1536);
    DIRMULT_RING_COPY(2048);
    DIRMULT_RING_COPY(2560);
    DIRMULT_RING_COPY(3072);
    DIRMULT_RING_COPY(3584);
#undef DIRMULT_RING_COPY
  }
  __pipeline_commit();
}

// One row of a warp's ring: waits for the row (the oldest of the kSlots
// groups the lane has in flight), reads its slot, looks its counts up in the
// chunk's slice (tq = slice + lane), lets refill() issue the warp's next
// item into the slot, takes the rare counts (row: the row's chunk, cols its
// columns) and adds the row's sums to writer. Shared by the ring kernels, so
// that their rows are the same sums in the same order.
template <int kSlots, typename Refill, typename Columns>
__device__ __forceinline__ void ring_row_step(const float4* __restrict__ slot,
                                              const float* __restrict__ tq, Refill refill,
                                              const float* __restrict__ row, Columns cols,
                                              const RowOut& o, double A, int64_t b, int64_t c,
                                              TableRowWriter& writer) {
  const int lane = threadIdx.x & 31;
  __pipeline_wait_prior(kSlots - 1);
  float4 n[kTableUnroll];
#pragma unroll
  for (int u = 0; u < kTableUnroll; ++u) n[u] = slot[lane + 32 * u];
  double s = 0.0, rare_N = 0.0, norm = 0.0;
  int table_N = 0;
  bool ok = true;
  const unsigned rare = add_table_terms<kTableUnroll>(n, tq, s, table_N);
  refill();  // the slot is read
  add_rare_terms(rare, row, 4 * lane, cols, o.normalize, s, rare_N, norm, ok);
  writer.add(o, A, b, c, true, s, table_N, rare_N, norm, ok);
}

// (A template, instantiated for float counts only, so that this header can
// define it in every .cu file that includes it.)
template <typename count_t>
__global__ void __launch_bounds__(kRingWarps * 32, 1)
    forward_table_ring_kernel(const count_t* __restrict__ counts, const float* __restrict__ table,
                              const ColumnAlpha<float>* __restrict__ cols,
                              const double* __restrict__ Apart, int nblk_alpha, int64_t B,
                              int64_t V, const RowOut o) {
  static_assert(std::is_same_v<count_t, float>, "16-byte copies of float32 counts");
  extern __shared__ float4 ring_smem[];  // the table slice, then the warps' rings
  float* tab = reinterpret_cast<float*>(ring_smem);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t c = blockIdx.x;
  const int64_t v0 = c * kTableChunk;
  const int len = static_cast<int>(min(V - v0, static_cast<int64_t>(kTableChunk)));
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kRingWarps;  // between a warp's rows
  float4* ring = ring_smem + kChunkFloats / 4 + warp * kRingSlots * kRingSlotVectors;
  // Rows past B: an empty group (issue_ring_row).
  auto fill = [&](int64_t b, int slot) {
    issue_ring_row(ring + slot * kRingSlotVectors, b < B ? counts + b * V + v0 : nullptr, len, lane);
  };
  int64_t b = static_cast<int64_t>(blockIdx.y) * kRingWarps + warp;
  wait_for_prior_grid();
  // The table slice: one group, waited for by every thread, then shared (the
  // rows' groups behind it may still be in flight).
  issue_table_slice(tab, table, c);
#pragma unroll
  for (int k = 0; k < kRingSlots; ++k) fill(b + k * stride, k);
  __pipeline_wait_prior(kRingSlots);  // the table's group (the rows' may be in flight)
  __syncthreads();
  const double A = alpha_total(Apart, 0, nblk_alpha);
  const float* tq = tab + lane;  // base = 4 lane
  TableRowWriter writer;
  for (int i = 0; b < B; ++i, b += stride) {
    const int slot = i % kRingSlots;
    ring_row_step<kRingSlots>(
        ring + slot * kRingSlotVectors, tq, [&] { fill(b + kRingSlots * stride, slot); },
        counts + b * V + v0, cols + v0, o, A, b, c, writer);
  }
  writer.flush(o, A);
}

// The forward for fill_table_in_block (few rows over more chunks than the
// GPU holds blocks) with float32 counts in 16-byte aligned rows, in one
// launch with nothing to wait for: a persistent block of kRingWarps warps
// per SM takes chunks blockIdx.x, + gridDim.x, ...; for each it fills the
// chunk's table slice itself (fill_table_slice) and streams the chunk's rows
// through its warps' rings as forward_table_ring_kernel does. A warp's rows
// (warp + kRingWarps r) of all its chunks are one sequence of ring items, so
// that the first rows of its next chunk are in flight across that chunk's
// fill. Rare counts take their columns from log_alpha
// (ColumnsFromLogAlpha), and the blocks with the fewest chunks (or none:
// the grid has blocks beside the chunks where they are fewer than the SMs)
// then compute the partial totals of alpha (Apart, nblk of them, two slices
// at once) for the finish, so that no alpha_prep_kernel runs before: its 32
// blocks held 32 SMs' registers away from this kernel's blocks. With
// finish (a cooperative launch), the blocks then finish the rows from the
// partials behind a grid barrier, as finish_rows_kernel does. The same sums
// in the same order as forward_table_kernel, and the same A.
//
// Measured without gain (GPU time per call): the next chunk's fill spread
// between the rows of the current one, into a second slice buffer (which
// leaves room for one row slot per warp): wide 41.1 vs 39.7 us, 32x262144
// 32.3 vs 31.6; only many rows gained (512x262144 150.3 vs 159.4). Warps
// split in two groups (eleventh session), 8 streaming rows through 2 slots
// each while 8 fill the next chunk's slice into the second buffer (every
// warp filling the first): slower everywhere, the stream starved of bytes
// in flight (64 KB per SM instead of 128; the two slices take 136 KB): wide
// 81.8 vs 66.9 us, 32x1048576 193.1 vs 145.2, 512x262144 440.8 vs 307.0
// (counts 0..9 with 0.1% of 23s: the rare path's float64 terms in both).
// Both slices double-buffered with rows in half-chunk ring items (two of 2
// KB per warp; fifteenth session), each warp filling its columns of the
// next slice between its rows, staggered: wide 36.5 vs 35.9 us, 32x1048576
// 86.5 vs 82.7, 512x262144 145.3 vs 150.7. A fill is ~1000 thread
// instructions per column, about as many as 64 rows' lookups, and the
// kernel already issues on ~60% of its cycles (ncu): the fill does not
// hide behind the stream.
template <typename count_t>
__global__ void __launch_bounds__(kRingWarps * 32, 1)
    forward_table_fill_ring_kernel(const count_t* __restrict__ counts,
                                   const float* __restrict__ log_alpha,
                                   double* __restrict__ Apart, int nblk_alpha, int64_t B,
                                   int64_t V, const RowOut o, bool finish) {
  static_assert(std::is_same_v<count_t, float>, "16-byte copies of float32 counts");
  static_assert(kRingWarps * 32 == 2 * kPrepThreads, "two alpha slices at once");
  extern __shared__ float4 ring_smem[];  // the table slice, then the warps' rings
  float* tab = reinterpret_cast<float*>(ring_smem);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  float4* ring = ring_smem + kChunkFloats / 4 + warp * kRingSlots * kRingSlotVectors;
  const int64_t rows = B > warp ? (B - warp - 1) / kRingWarps + 1 : 0;  // per chunk
  // The next item to issue: row warp + kRingWarps * next_r of chunk next_c.
  int64_t next_r = 0, next_c = blockIdx.x;
  auto issue_next = [&](int slot) {
    const float* row = nullptr;
    int len = 0;
    if (next_r < rows && next_c < o.num_chunks) {
      const int64_t v0 = next_c * kTableChunk;
      row = counts + (warp + kRingWarps * next_r) * V + v0;
      len = static_cast<int>(min(V - v0, static_cast<int64_t>(kTableChunk)));
    }
    issue_ring_row(ring + slot * kRingSlotVectors, row, len, lane);
    if (++next_r == rows) next_r = 0, next_c += gridDim.x;
  };
  // A chunk's log_alpha is loaded before the rings carry any of its rows
  // (the first chunk's before the first rows, the next chunk's when this
  // one's stream starts), so that it is not served behind them (GPU time
  // per call: wide 39.7 -> 37.1 us, 40x210000 31.6 -> 29.4, 32x1048576
  // 100.2 -> 86.1; loaded inside the fill, the first fill took ~8 us and
  // the later ones ~5).
  SliceAlpha<kRingWarps * 32> alpha;
  alpha.load(log_alpha, V, blockIdx.x);
#pragma unroll
  for (int k = 0; k < kRingSlots; ++k) issue_next(k);
  const float* tq = tab + lane;  // base = 4 lane
  TableRowWriter writer;  // (several chunks: partials, no finish here)
  int slot = 0;
  for (int64_t c = blockIdx.x; c < o.num_chunks; c += gridDim.x) {
    // (Its first barrier also waits for every warp's last lookups in the
    // previous chunk's slice.)
    fill_table_slice(tab, alpha, V, c, o.normalize);
    if (c + gridDim.x < o.num_chunks) alpha.load(log_alpha, V, c + gridDim.x);
    const int64_t v0 = c * kTableChunk;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = warp + kRingWarps * r;
      // (refill: the warp's item kRingSlots on)
      ring_row_step<kRingSlots>(ring + slot * kRingSlotVectors, tq, [&] { issue_next(slot); },
                                counts + b * V + v0, ColumnsFromLogAlpha{log_alpha + v0}, o, 0.0,
                                b, c, writer);
      slot = slot + 1 == kRingSlots ? 0 : slot + 1;
    }
  }
  // Alpha's partial totals, two slices at a time, by the blocks with one
  // chunk fewer than the others (blocks [num_chunks % G, G), G the grid;
  // every block where the chunks spread evenly), which run out of chunks
  // first, each slice's loads all in flight at once (up to 32 per thread):
  // the tail after the last chunks is then the grid barrier and the finish.
  // By the grid's last 16 blocks with 8 loads in flight, the tail was ~7.5
  // us of the wide forward's 37 (half of those blocks held two chunks);
  // now, GPU time per call (sixteenth session, the same bits): wide 36.0 ->
  // 33.0 us, 8x262144 19.1 -> 16.8, 1x262144 17.6 -> 15.9, 1x32768 12.2 ->
  // 10.4, 5x100000 12.8 -> 10.9, 32x1048576 83.9 -> 81.9.
  const int64_t light0 = o.num_chunks % gridDim.x;
  const int64_t light = gridDim.x - light0;
  const int half = threadIdx.x / kPrepThreads;
  for (int64_t s0 = 2 * (blockIdx.x - light0); s0 >= 0 && s0 < nblk_alpha; s0 += 2 * light) {
    const int s = static_cast<int>(s0) + half;
    prep_alpha_slice_group<float, false, 2, 32>(log_alpha, V, 0, s, nblk_alpha, nullptr, Apart,
                                                s < nblk_alpha);
    __syncthreads();  // (the slices' warp totals are reused)
  }
  if (!finish) return;  // (finish_rows_kernel then)
  // Launched cooperatively: every block's partials and Apart are in after
  // the grid barrier, and the rows are finished here, as finish_rows_kernel
  // would (finish_pair: the same bits).
  cooperative_groups::this_grid().sync();
  if (o.num_chunks <= kMaxChunksPerThread) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < B;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      finish_pair(o.partial, Apart, nblk_alpha, i, 1, o.num_chunks, false, o.normalize, true,
                  o.out);
    }
  } else {
    // A warp per row, the rows spread over the SMs first (a block's 16 warps
    // reading their rows' partials at once waited longer for the L2).
    for (int64_t i = static_cast<int64_t>(warp) * gridDim.x + blockIdx.x; i < B;
         i += static_cast<int64_t>(gridDim.x) * kRingWarps) {
      finish_pair(o.partial, Apart, nblk_alpha, i, 1, o.num_chunks, false, o.normalize, false,
                  o.out);
    }
  }
}
}  // namespace cuda
}  // namespace dirmult
