// Where the CPU's AVX2 kernels are compiled (DM_CPU_AVX2: x86-64 with GCC or
// Clang; their functions carry target attributes) and whether they may run:
// DIRMULT_CPU_SIMD=none turns them off (the scalar paths then; each file
// reads it once per process). Their results are the same bits either way
// where documented (tests compare the two), and the switch rules them out
// when something looks wrong on an unusual CPU.
#pragma once

#include <cstdlib>
#include <cstring>

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

}  // namespace cpu
}  // namespace dirmult
