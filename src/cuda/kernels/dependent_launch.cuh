// The device side of programmatic dependent launch (the host side:
// launch_dependent, launch.h).
#pragma once


namespace dirmult {
namespace cuda {

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

}  // namespace cuda
}  // namespace dirmult
