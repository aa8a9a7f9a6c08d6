// dm_log_normal (include/dirmult/math.h) against the toolkit's logf, bit for
// bit, over every normal finite float x > 0 (2^31 - 2^24 of them, well
// under a second on an H200). dm_log_normal is logf's arithmetic without
// its special cases; a toolkit whose logf differs shows here first.
// Run by scripts/gpu/gpu_check.sh (check stage):
//   nvcc -std=c++17 -arch=sm_90 -I include scripts/gpu/check_log_normal.cu -o /tmp/check_log_normal
#include <cstdint>
#include <cstdio>

#include "dirmult/math.h"

__global__ void compare_all(unsigned long long* mismatches, unsigned* first_bad) {
  const uint32_t stride = gridDim.x * blockDim.x;
  for (uint32_t bits = 0x00800000u + blockIdx.x * blockDim.x + threadIdx.x; bits < 0x7f800000u;
       bits += stride) {
    const float x = __uint_as_float(bits);
    if (__float_as_uint(dirmult::dm_log_normal(x)) != __float_as_uint(logf(x))) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first_bad, bits);
    }
  }
}

int main() {
  unsigned long long* mismatches;
  unsigned* first_bad;
  cudaMallocManaged(&mismatches, sizeof(*mismatches));
  cudaMallocManaged(&first_bad, sizeof(*first_bad));
  *mismatches = 0;
  *first_bad = 0xffffffffu;
  compare_all<<<132 * 16, 256>>>(mismatches, first_bad);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 2;
  }
  std::printf("dm_log_normal vs logf over all normal floats > 0: %llu mismatches", *mismatches);
  if (*mismatches != 0) std::printf(" (first at bits 0x%08x)", *first_bad);
  std::printf("\n");
  return *mismatches == 0 ? 0 : 1;
}
