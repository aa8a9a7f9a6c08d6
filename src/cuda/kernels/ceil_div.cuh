// Integer ceiling division, for host grid sizes and device slices.
#pragma once

#include <cstdint>

namespace dirmult {
namespace cuda {

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace cuda
}  // namespace dirmult
