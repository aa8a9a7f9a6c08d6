// The ring kernels: the shared-alpha float32 forward with the lookup table,
// float32 counts in 16-byte aligned rows streamed through shared-memory rings
// by cp.async (See Note [Tables]).
#pragma once

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include "alpha_prep.cuh"
#include "dependent_launch.cuh"
#include "finish_rows.cuh"
#include "forward_table.cuh"
#include "rare_counts.cuh"
#include "table_fill.cuh"
#include "table_layout.cuh"
#include "table_lookup.cuh"

namespace dirmult {
namespace cuda {

// Forward with the table for float32 counts in 16-byte aligned rows, many of
// them (tall): a warp's rows go through a ring of kRingSlots row slots in
// shared memory, filled by asynchronous 16-byte copies (cp.async) that each
// lane issues for its own vectors and waits for itself, so that the warp's
// next row is in flight while it looks up the current one, without holding
// registers (forward_table_kernel holds its rows in flight in registers, and
// only while it waits for them). One block of kRingWarps warps per SM: the
// table slice and the rings fill the shared memory (16 warps x 2 slots:
// BENCHMARKS.md). The same sums in the same order as forward_table_kernel
// (See Note [Batch invariance]).
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
                                              const RowOut& o, double log_A, int64_t b, int64_t c,
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
  writer.add(o, log_A, b, c, true, s, table_N, rare_N, norm, ok);
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
  const double log_A = alpha_log_total<float>(Apart, 0, nblk_alpha);
  const float* tq = tab + lane;  // base = 4 lane
  TableRowWriter writer;
  for (int i = 0; b < B; ++i, b += stride) {
    const int slot = i % kRingSlots;
    ring_row_step<kRingSlots>(
        ring + slot * kRingSlotVectors, tq, [&] { fill(b + kRingSlots * stride, slot); },
        counts + b * V + v0, cols + v0, o, log_A, b, c, writer);
  }
  writer.flush(o, log_A);
}

// The forward for TableForward::kFillRing (few rows over more chunks than the
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
// Splitting or double-buffering the next chunk's fill behind the rows
// measured no gain (BENCHMARKS.md): a fill is ~1000 thread instructions per
// column, about as many as 64 rows' lookups, and does not hide behind the
// stream.
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
  // one's stream starts), so that it is not served behind them
  // (BENCHMARKS.md).
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
  // (BENCHMARKS.md.)
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
      finish_pair<float>(o.partial, Apart, nblk_alpha, nullptr, 0, i, 1, o.num_chunks, false,
                         o.normalize, true, o.out);
    }
  } else {
    // A warp per row, the rows spread over the SMs first (a block's 16 warps
    // reading their rows' partials at once waited longer for the L2).
    for (int64_t i = static_cast<int64_t>(warp) * gridDim.x + blockIdx.x; i < B;
         i += static_cast<int64_t>(gridDim.x) * kRingWarps) {
      finish_pair<float>(o.partial, Apart, nblk_alpha, nullptr, 0, i, 1, o.num_chunks, false,
                         o.normalize, false, o.out);
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
