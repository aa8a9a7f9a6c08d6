// tpoch_terms_kernel: the second-derivative terms (a2tpoch, dadpoch) of each
// (log_alpha, n) pair. See Note [Trigamma terms].
#pragma once

#include <cstdint>

#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

template <typename scalar_t>
__global__ void tpoch_terms_kernel(const scalar_t* __restrict__ log_alpha,
                                   const scalar_t* __restrict__ n, int64_t size,
                                   scalar_t* __restrict__ a2t, scalar_t* __restrict__ dad) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size) return;
  const TpochTerms r = tpoch_terms(log_alpha[i], n[i]);
  a2t[i] = static_cast<scalar_t>(r.a2tpoch);
  dad[i] = static_cast<scalar_t>(r.dadpoch);
}

}  // namespace cuda
}  // namespace dirmult
