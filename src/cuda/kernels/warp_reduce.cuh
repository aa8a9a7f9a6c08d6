// Warp collectives: sums in a fixed shuffle order (See Note [Determinism]),
// prefix sums, a reduce-scatter, and word-wise shuffles of structs.
#pragma once

#include <cstdint>
#include <cstring>

namespace dirmult {
namespace cuda {

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
  return x;  // valid in lane 0
}

// The same fixed tree as warp_sum, as a butterfly: valid in every lane.
template <typename T>
__device__ __forceinline__ T warp_allsum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The inclusive prefix sum of x over the warp's lanes (Hillis-Steele over
// shuffles); warp-uniform call.
__device__ __forceinline__ int warp_inclusive_scan(int x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// v from lane src, for a value of whole 32-bit words (a struct of
// doubles): a shuffle per word. Warp-uniform call.
template <typename T>
__device__ __forceinline__ T shfl_words(const T& v, int src) {
  static_assert(sizeof(T) % sizeof(int) == 0, "whole 32-bit words");
  constexpr int kWords = sizeof(T) / sizeof(int);
  int in[kWords], out[kWords];
  memcpy(in, &v, sizeof(T));
#pragma unroll
  for (int w = 0; w < kWords; ++w) out[w] = __shfl_sync(0xffffffffu, in[w], src);
  T r;
  memcpy(&r, out, sizeof(T));
  return r;
}

// One level of warp_reduce_scatter: lanes exchange half of their S * 2
// values with the lane S away, keeping the half that their bit S selects.
// A template per level, so that every loop has a constant trip count and
// unrolls fully: every index into v is then a constant and v stays in
// registers (an index that is not a constant puts v in local memory;
// `cuobjdump -res-usage` must show STACK:0 for the kernels that use it).
template <int KB, int S, typename T>
__device__ __forceinline__ void reduce_scatter_level(T (&v)[KB], int lane) {
  if constexpr (S >= 1) {
    const bool upper = (lane & S) != 0;
#pragma unroll
    for (int i = 0; i < S; ++i) {
      const T send = upper ? v[i] : v[i + S];
      const T keep = upper ? v[i + S] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, S);
    }
    reduce_scatter_level<KB, S / 2, T>(v, lane);
  }
}

// Sums v[k] over the warp for every k at once (a reduce-scatter: KB - 1
// shuffles, not KB * 5). Returns, in lane l, the sum for k = l % KB, the
// same value in each of its 32 / KB lanes; the order of the additions is fixed.
template <int KB, typename T>
__device__ __forceinline__ T warp_reduce_scatter(T (&v)[KB], int lane) {
  static_assert(KB >= 1 && KB <= 32 && (KB & (KB - 1)) == 0, "KB is a power of two");
  reduce_scatter_level<KB, KB / 2, T>(v, lane);
  T r = v[0];
#pragma unroll
  for (int o = KB; o < 32; o <<= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

// The sum of p[0], p[stride], ..., p[(n - 1) stride], split across the
// warp's lanes (lane l takes l, l + 32, ...) and combined by the fixed
// shuffle tree: the loads overlap instead of queueing behind each other, and
// the order (so the result) depends on n only. Valid in lane 0.
__device__ __forceinline__ double warp_ordered_sum(const double* __restrict__ p, int64_t n,
                                                   int64_t stride) {
  const int lane = threadIdx.x & 31;
  double s = 0.0;
#pragma unroll 4
  for (int64_t i = lane; i < n; i += 32) s += p[i * stride];
  return warp_sum(s);
}

}  // namespace cuda
}  // namespace dirmult
