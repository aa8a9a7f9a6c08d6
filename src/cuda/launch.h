// Host launch helpers: the current stream, launch checks, device attributes,
// programmatic dependent and cooperative launches, and the shared-memory
// opt-in and occupancy that size the grids to one wave of resident blocks
// (See Note [One wave]).
#pragma once

#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

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

// Programmatic dependent launch (sm_90 and newer): see
// kernels/dependent_launch.cuh for the kernels' side. A kernel launched by
// launch_dependent may start while the kernel before it in the stream still
// runs; on older GPUs the launch is an ordinary one.
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

// Raises a kernel's dynamic shared-memory limit to `bytes`, once per device
// (the attribute is per device), and returns how many of its blocks of
// `threads` fit on one SM, so grids can be sized to whole waves. The kernel
// is a template argument so that each kernel has its own cache (kernels of
// the same signature share a function type).
template <auto kKernel>
int opt_in_smem(int threads, size_t bytes) {
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
// whole GPU at once: grids of this many blocks run in one wave (See Note
// [One wave]).
template <auto kKernel>
int64_t one_wave_blocks(int threads, size_t bytes) {
  return static_cast<int64_t>(opt_in_smem<kKernel>(threads, bytes)) * num_sms();
}

}  // namespace cuda
}  // namespace dirmult
