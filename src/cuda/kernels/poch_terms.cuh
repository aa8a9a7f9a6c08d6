// poch_terms_kernel: lnpoch and adpoch of each (log_alpha, n) pair.
#pragma once

#include <cstdint>

#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

template <typename scalar_t>
__global__ void poch_terms_kernel(const scalar_t* __restrict__ log_alpha,
                                  const scalar_t* __restrict__ n, int64_t size,
                                  scalar_t* __restrict__ lnp, scalar_t* __restrict__ adp) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size) return;
  const scalar_t a = dm_exp(log_alpha[i]);
  lnp[i] = lnpoch(a, log_alpha[i], n[i]);
  adp[i] = adpoch(a, n[i]);
}

}  // namespace cuda
}  // namespace dirmult
