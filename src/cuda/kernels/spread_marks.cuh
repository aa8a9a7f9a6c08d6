// spread_marks: a warp's rare items computed spread over its lanes.
#pragma once

#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// A warp's marked items, computed spread over its lanes: bit e of a lane's
// marks is its item e, and the i-th mark of the warp in (lane, bit) order
// is computed by lane i % 32 (compute(owner, e), a Value for the owner
// lane's item e; Value: whole 32-bit words, shfl_words). The values go back
// to their lanes, which consume(e, value) them in bit order, as a loop over
// their own marks would: the same values summed in the same order, in
// ceil(marks / 32) rounds of computing instead of as many as the lane with
// the most marks (See Note [Rare counts]). Warp-uniform call.
template <typename Value, typename Compute, typename Consume>
__device__ __forceinline__ void spread_marks(unsigned marks, Compute compute, Consume consume) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  const int mine = __popc(marks);
  const int end = warp_inclusive_scan(mine, lane);  // the marks of lanes 0 .. lane
  const int first = end - mine;
  const int total = __shfl_sync(kAll, end, 31);
  unsigned left = marks;  // this lane's marks not consumed yet
#pragma unroll 1
  for (int r0 = 0; r0 < total; r0 += 32) {
    // Mark i's lane: the first whose end passes i (ends never decrease).
    const int i = r0 + lane;
    int owner = 0;
#pragma unroll
    for (int step = 16; step > 0; step >>= 1) {
      if (__shfl_sync(kAll, end, owner + step - 1) <= i) owner += step;
    }
    unsigned m = __shfl_sync(kAll, marks, owner);
    const int owner_first = __shfl_sync(kAll, first, owner);
    Value value{};
    if (i < total) {
      for (int k = owner_first; k < i; ++k) m &= m - 1;  // the owner's (i - first)-th mark
      value = compute(owner, __ffs(static_cast<int>(m)) - 1);
    }
    // This lane's marks among the round's: indices [lo, hi), from lanes lo - r0 ..
    const int lo = max(first, r0), hi = min(end, r0 + 32);
    const int count = max(hi - lo, 0);
    const int steps = __reduce_max_sync(kAll, static_cast<unsigned>(count));
#pragma unroll 1
    for (int k = 0; k < steps; ++k) {
      const Value got = shfl_words(value, (lo + k - r0) & 31);
      if (k < count) {
        consume(__ffs(static_cast<int>(left)) - 1, got);
        left &= left - 1;
      }
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
