// The count kernels' side of the tables (See Note [Tables]): a slice staged
// in shared memory, a count's index, and the branch-free lookups.
#pragma once

#include <cuda_pipeline.h>

#include "table_layout.cuh"
#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

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

}  // namespace cuda
}  // namespace dirmult
