// Where the CPU's AVX2 kernels are compiled (DM_CPU_AVX2: x86-64 with GCC or
// Clang; their functions carry target attributes) and whether they may run:
// DIRMULT_CPU_SIMD=none turns them off (the scalar paths then; each file
// reads it once per process). Their results are the same bits either way
// where documented (tests compare the two), and the switch rules them out
// when something looks wrong on an unusual CPU. Also the AVX2 helpers both
// kernel files use.
#pragma once

#include <cstdlib>
#include <cstring>

#include "dirmult/math.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DM_CPU_AVX2 1
#endif

namespace dirmult {
namespace cpu {

inline bool cpu_simd_allowed() {
  const char* e = std::getenv("DIRMULT_CPU_SIMD");
  return e == nullptr || std::strcmp(e, "none") != 0;
}

#ifdef DM_CPU_AVX2
// math.h's exact_factors(a, 1 / a) for eight lanes, shared by the AVX2
// files: factors (a + k) below kStirlingMin (small), else (1 + k / a), with
// n log a apart. (No multiply-add: the same bits with or without FMA.)
struct Factors8 {
  __m256 small, base, step;
};

__attribute__((target("avx2"))) inline Factors8 exact_factors8(__m256 a) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 small = _mm256_cmp_ps(a, _mm256_set1_ps(Tuning<float>::kStirlingMin), _CMP_LT_OQ);
  return {small, _mm256_blendv_ps(one, a, small),
          _mm256_blendv_ps(_mm256_div_ps(one, a), one, small)};
}
#endif

}  // namespace cpu
}  // namespace dirmult
