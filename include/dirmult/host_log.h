// log x in float for the host's exact path (dm_log_normal in math.h), the
// same bits in scalar code and in AVX2 lanes (host_log_normal4 in
// src/cpu/shared_rows_avx2.cpp computes four at once the same way).
//
// glibc's logf cannot be vectorized to its own bits (its FMA variant is
// picked at run time), and a float polynomial with fused multiply-adds has
// no fast scalar twin on baseline x86-64 (std::fma is a libm call there).
// So the log is computed in double, with double multiplies and adds only
// (the same bits in SSE2 and AVX2; the CPU sources are built with
// -ffp-contract=off so that no context fuses them), and rounded to float
// once: x = 2^k m, m in [1, 2), c = 1 + i / 128 the table point at or below
// m (its top 7 mantissa bits), r = m / c - 1 in [0, 2^-7),
//   log x = k log 2 + log c + log1p(r),
// log1p(r) to degree 5 (truncated at r^6 / 6 < 2^-44; at i = 0, where the
// result is r-sized, relatively at r^5 / 6). Over every float in [1,
// FLT_MAX] (scripts/check_host_log.cpp), 5 of the 2^30 results differ from
// log in double rounded to float, by at most 0.5000 ulp (glibc's logf:
// 0.82 ulp). As fast as glibc's logf on one value (3.4 ns).
#pragma once

#include <cstdint>
#include <cstring>

#include "host_log_table.h"

namespace dirmult {
namespace host_log {

constexpr double kLn2 = 0x1.62e42fefa39efp-1;  // log 2, nearest double
constexpr double kThird = 0x1.5555555555555p-2;  // 1 / 3, nearest double

// log1p(r) for r in [0, 2^-7): r + r^2 (-1/2 + r (1/3 + r (-1/4 + r / 5))).
inline double log1p_small(double r) {
  double q = r * 0.2 - 0.25;
  q = q * r + kThird;
  q = q * r - 0.5;
  return r + (r * r) * q;
}

}  // namespace host_log

// x normal, finite and > 0 (the exact path's products are >= 1).
inline float host_log_normal(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int k = static_cast<int>(bits >> 23) - 127;
  const int i = static_cast<int>((bits >> (23 - host_log::kTableBits)) &
                                 ((1u << host_log::kTableBits) - 1));
  const uint32_t m_bits = (bits & 0x007fffffu) | 0x3f800000u;
  float m;
  std::memcpy(&m, &m_bits, sizeof m);
  const double r = static_cast<double>(m) * host_log::kInvC[i] - 1.0;
  const double y = static_cast<double>(k) * host_log::kLn2 + host_log::kLogC[i];
  return static_cast<float>(y + host_log::log1p_small(r));
}

}  // namespace dirmult
