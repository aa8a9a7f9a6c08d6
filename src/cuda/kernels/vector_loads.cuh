// Loads of four consecutive counts (or log_alpha), converted to the compute
// type in registers: 16-byte vector loads where the row allows them.
#pragma once

#include <cstdint>


namespace dirmult {
namespace cuda {

// Whether p is aligned for the vector loads of four T (the host's choice
// of `aligned`, with V % 4 == 0).
template <typename T>
bool is_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Four consecutive counts, converted to the compute type in registers.
// The vector path needs the four to be aligned to 4 * sizeof(count_t).
template <typename count_t>
struct alignas(4 * sizeof(count_t)) Count4 {
  count_t v[4];
};

template <typename scalar_t, typename count_t>
__device__ __forceinline__ void load4(const count_t* __restrict__ p, scalar_t out[4],
                                      double out_exact[4]) {
  const Count4<count_t> c = *reinterpret_cast<const Count4<count_t>*>(p);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<scalar_t>(c.v[j]);
    out_exact[j] = static_cast<double>(c.v[j]);
  }
}

template <>
__device__ __forceinline__ void load4<float, float>(const float* __restrict__ p, float out[4],
                                                    double out_exact[4]) {
  const float4 c = __ldg(reinterpret_cast<const float4*>(p));
  out[0] = c.x, out[1] = c.y, out[2] = c.z, out[3] = c.w;
#pragma unroll
  for (int j = 0; j < 4; ++j) out_exact[j] = out[j];
}

template <>
__device__ __forceinline__ void load4<double, double>(const double* __restrict__ p,
                                                      double out[4], double out_exact[4]) {
  const double2 c0 = __ldg(reinterpret_cast<const double2*>(p));
  const double2 c1 = __ldg(reinterpret_cast<const double2*>(p) + 1);
  out[0] = c0.x, out[1] = c0.y, out[2] = c1.x, out[3] = c1.y;
#pragma unroll
  for (int j = 0; j < 4; ++j) out_exact[j] = out[j];
}

// Loads up to four counts starting at column v (of V), zero-filling past the
// end; vectorized when `aligned`.
template <typename scalar_t, typename count_t>
__device__ __forceinline__ void load_counts(const count_t* __restrict__ row, int64_t v,
                                            int64_t v_end, bool aligned, scalar_t out[4],
                                            double out_exact[4]) {
  if (aligned && v + 4 <= v_end) {
    load4<scalar_t, count_t>(row + v, out, out_exact);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const bool in = v + j < v_end;
    const count_t c = in ? row[v + j] : count_t(0);
    out[j] = static_cast<scalar_t>(c);
    out_exact[j] = static_cast<double>(c);
  }
}

// A lane's columns (0 .. 4) in a per-sample step, its four from 4 lane,
// with `left` columns from the step's first.
__device__ __forceinline__ int lane_columns(int64_t left, int lane) {
  const int64_t lane_left = left - 4 * lane;
  return lane_left >= 4 ? 4 : (lane_left > 0 ? static_cast<int>(lane_left) : 0);
}

// load_counts for a per-sample row: a lane's four counts and log_alpha from
// its pointers, `in` (0 .. 4) of them inside the row piece; past it counts
// read as 0 and log_alpha as la_past_end. Vectorized when `aligned` and all
// four are in.
template <typename count_t>
__device__ __forceinline__ void load_lane_counts(const count_t* __restrict__ c,
                                                 const float* __restrict__ l, int in,
                                                 bool aligned, float la_past_end, float n[4],
                                                 float la[4]) {
  double unused[4];
  if (aligned && in == 4) {
    load4<float, count_t>(c, n, unused);
    load4<float, float>(l, la, unused);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    n[j] = j < in ? static_cast<float>(__ldg(c + j)) : 0.0f;
    la[j] = j < in ? __ldg(l + j) : la_past_end;
  }
}

}  // namespace cuda
}  // namespace dirmult
