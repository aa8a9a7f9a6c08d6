// Small CUDA helpers: the current stream, launch checks, vector loads of four
// counts, warp reductions.
#pragma once

#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dirmult {
namespace cuda {

inline cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream) == AOTI_TORCH_SUCCESS,
                  "dirmult: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

#define DM_CUDA_CHECK_LAUNCH()                                                  \
  do {                                                                          \
    const cudaError_t err_ = cudaGetLastError();                                \
    STD_TORCH_CHECK(err_ == cudaSuccess, "dirmult: CUDA kernel launch failed: ", \
                    cudaGetErrorString(err_));                                  \
  } while (0)

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// A warp's marked items, computed spread over its lanes: bit e of a lane's
// marks is its item e, and the i-th mark of the warp in (lane, bit) order
// is computed by lane i % 32 (compute(owner, e), a Value for the owner
// lane's item e; Value: whole 32-bit words, shfl_words). The values go back
// to their lanes, which consume(e, value) them in bit order, as a loop over
// their own marks would: the same values summed in the same order, in
// ceil(marks / 32) rounds of computing instead of as many as the lane with
// the most marks (the off-table counts' math path: tall forward with 1% of
// the counts at 200..999, 312 -> 201 us). Warp-uniform call.
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

// An attribute of the current device, asked of the driver once per device
// (the launchers need it on every call). 0 until asked: the attributes
// cached are positive.
template <cudaDeviceAttr kAttr>
inline int cached_device_attribute() {
  static int cached[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) dev = 0;
  if (cached[dev] == 0) cudaDeviceGetAttribute(&cached[dev], kAttr, dev);
  return cached[dev];
}

// Streaming multiprocessors of the current device.
inline int num_sms() {
  const int sms = cached_device_attribute<cudaDevAttrMultiProcessorCount>();
  return sms > 0 ? sms : 132;
}

// Programmatic dependent launch (sm_90 and newer). A kernel launched by
// launch_dependent may start while the kernel before it in the stream (one
// that calls allow_dependent_launch) still runs: it can issue work that
// does not depend on that kernel and must call
// wait_for_prior_grid() before it reads anything that kernel writes. The
// wait returns when the prior grid has completed and its writes are
// visible. On older GPUs both are no-ops and the launch is an ordinary one.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether the current device runs programmatic dependent launches.
inline bool device_has_dependent_launch() {
  return cached_device_attribute<cudaDevAttrComputeCapabilityMajor>() >= 9;
}

// cudaLaunchKernelEx of kernel with one launch attribute (none where !use).
template <typename... Params, typename... Args>
cudaError_t launch_with_attribute(void (*kernel)(Params...), dim3 grid, dim3 block,
                                  size_t smem_bytes, cudaStream_t stream,
                                  cudaLaunchAttribute attribute, bool use, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = use ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                      cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  const cudaError_t err = launch_with_attribute(kernel, grid, block, smem_bytes, stream, attribute,
                                                device_has_dependent_launch(), args...);
  STD_TORCH_CHECK(err == cudaSuccess, "dirmult: CUDA kernel launch failed: ",
                  cudaGetErrorString(err));
}

// Whether the current device runs cooperative launches (a grid-wide
// barrier inside a kernel whose blocks are all resident at once).
inline bool device_has_cooperative_launch() {
  return cached_device_attribute<cudaDevAttrCooperativeLaunch>() != 0;
}

// A cooperative launch (cooperative_groups::this_grid().sync() is valid in
// the kernel), where the device runs them and holds the whole grid at once.
// Returns false, having launched nothing, where it does not (a device
// without cooperative launches, or an MPS client given fewer SMs than the
// grid was sized for: cudaErrorCooperativeLaunchTooLarge, cleared here);
// other errors raise.
template <typename... Params, typename... Args>
bool try_launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                            cudaStream_t stream, Args... args) {
  if (!device_has_cooperative_launch()) return false;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  const cudaError_t err =
      launch_with_attribute(kernel, grid, block, smem_bytes, stream, attribute, true, args...);
  if (err == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // a launch-configuration error: not sticky
    return false;
  }
  STD_TORCH_CHECK(err == cudaSuccess, "dirmult: CUDA kernel launch failed: ",
                  cudaGetErrorString(err));
  return true;
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
