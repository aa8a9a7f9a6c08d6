// DIRMULT_CPU_SIMD=none turns the CPU's AVX2 kernels off (the scalar paths
// then; read once per process): their results are the same bits either way
// where documented (tests compare the two), and it rules them out when
// something looks wrong on an unusual CPU.
#pragma once

#include <cstdlib>
#include <cstring>

namespace dirmult {
namespace cpu {

inline bool cpu_simd_allowed() {
  const char* e = std::getenv("DIRMULT_CPU_SIMD");
  return e == nullptr || std::strcmp(e, "none") != 0;
}

}  // namespace cpu
}  // namespace dirmult
