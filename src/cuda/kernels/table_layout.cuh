// The lookup tables' layout (See Note [Tables]): a slice of kTableChunk
// columns per block, entry (column, n) at its shared-memory slot.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ceil_div.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

constexpr int kTableChunk = 1024;                // columns per block (smem slice)
constexpr int kTableUnroll = 8;                  // 16-byte loads in flight per lane
constexpr size_t kTableSmemBytes = kTableChunk * kTableWidth * sizeof(float);
// A lane's unrolled loads (or two halves of them) cover a whole chunk, so
// every column a lane touches is inside the chunk's table slice.
static_assert(kTableUnroll * 128 == kTableChunk, "a warp's unrolled loads span one chunk");

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

// The column of its chunk whose entries slot p of a kChunkSlots slice holds:
// (p % (kTableChunk / 4)) * 4 + p / (kTableChunk / 4) (table_slot(v, 0) = p).
__device__ __forceinline__ int slice_column(int p) {
  return (p % (kTableChunk / 4)) * 4 + p / (kTableChunk / 4);
}

// Shared-memory position of (column v of the chunk, count n): n-major, and
// within an n-row column v sits at (v % 4) * (chunk / 4) + v / 4, so the 32
// lanes of a warp, each reading 4 consecutive columns, hit 32 different banks
// for every j, whatever counts they hold.
__device__ __forceinline__ int table_slot(int v, int n) {
  return n * kTableChunk + (v & 3) * (kTableChunk / 4) + (v >> 2);
}

}  // namespace cuda
}  // namespace dirmult
