// log and exp in float on the host (dm_log_normal and dm_exp in math.h),
// the same bits in scalar code and in AVX2 lanes (host_log4 and host_exp4
// in src/cpu/shared_rows_avx2.cpp compute four at once the same way).
//
// glibc's logf and expf cannot be vectorized to their own bits (their FMA
// variants are picked at run time), and a float polynomial with fused
// multiply-adds has no fast scalar twin on baseline x86-64 (std::fma is a
// libm call there). So both are computed in double, with double multiplies
// and adds only (the same bits in SSE2 and AVX2; the CPU sources are built
// with -ffp-contract=off so that no context fuses them), and rounded to
// float once, as glibc's are. Tables: scripts/codegen/gen_host_float_table.py.
//
// log: x = 2^k m, m in [1, 2), c = 1 + i / 128 the table point at or below
// m (its top 7 mantissa bits), r = m / c - 1 in [0, 2^-7),
//   log x = k log 2 + log c + log1p(r),
// log1p(r) to degree 5 (truncated at r^6 / 6 < 2^-44; at i = 0, where the
// result is r-sized, relatively at r^5 / 6). Over every float in [1,
// FLT_MAX] (scripts/ci/check_host_float.cpp), 5 of the 2^30 results differ from
// log in double rounded to float, by at most 0.5000 ulp (glibc's logf:
// 0.82 ulp). As fast as glibc's logf on one value (3.4 ns).
//
// exp: t = x 64 / log 2, k = t rounded, r = t - k in [-1/2, 1/2],
//   e^x = 2^(k >> 6) 2^((k & 63) / 64) e^(r log 2 / 64),
// the last to degree 4 (|y| < 0.0055: truncated at y^5 / 120 < 2^-44).
// x is clamped to [-104, 89] first (e^x then rounds to 0 or to inf in
// float, as it should); NaN stays NaN. Over every float in [-104, 89]
// (check_host_float.cpp), 19 of the 2.2e9 results differ from exp in double
// rounded to float, by at most 0.5000 ulp, subnormal results included.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_float_table.h"

namespace dirmult {
namespace host_float {

constexpr double kLn2 = 0x1.62e42fefa39efp-1;  // log 2, nearest double
constexpr double kThird = 0x1.5555555555555p-2;  // 1 / 3, nearest double
constexpr double kLn2Over64 = 0x1.62e42fefa39efp-7;  // nearest double
constexpr double k64OverLn2 = 0x1.71547652b82fep+6;  // nearest double
constexpr double kSixth = 0x1.5555555555555p-3;      // 1 / 6, nearest double
constexpr double kTwentyFourth = 0x1.5555555555555p-5;  // 1 / 24, nearest double
constexpr float kExpMin = -104.0f, kExpMax = 89.0f;

// e^y for |y| < 0.0055: 1 + y (1 + y (1/2 + y (1/6 + y / 24))).
inline double expm_small(double y) {
  double q = y * kTwentyFourth + kSixth;
  q = q * y + 0.5;
  q = q * y + 1.0;
  return q * y + 1.0;
}

// log1p(r) for r in [0, 2^-7): r + r^2 (-1/2 + r (1/3 + r (-1/4 + r / 5))).
inline double log1p_small(double r) {
  double q = r * 0.2 - 0.25;
  q = q * r + kThird;
  q = q * r - 0.5;
  return r + (r * r) * q;
}

}  // namespace host_float

// e^x in float.
inline float host_exp(float x) {
  if (x != x) return x;
  const float xc = x < host_float::kExpMin ? host_float::kExpMin
                   : x > host_float::kExpMax ? host_float::kExpMax : x;
  const double t = static_cast<double>(xc) * host_float::k64OverLn2;
  const double kd = std::nearbyint(t);
  const int k = static_cast<int>(kd);
  const double y = (t - kd) * host_float::kLn2Over64;
  uint64_t bits;
  std::memcpy(&bits, &host_float::kExp2[k & ((1 << host_float::kExpTableBits) - 1)], sizeof bits);
  bits += static_cast<uint64_t>(static_cast<int64_t>(k >> host_float::kExpTableBits)) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return static_cast<float>(scale * host_float::expm_small(y));
}

// x normal, finite and > 0 (the exact path's products are >= 1).
inline float host_log_normal(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const int k = static_cast<int>(bits >> 23) - 127;
  const int i = static_cast<int>((bits >> (23 - host_float::kTableBits)) &
                                 ((1u << host_float::kTableBits) - 1));
  const uint32_t m_bits = (bits & 0x007fffffu) | 0x3f800000u;
  float m;
  std::memcpy(&m, &m_bits, sizeof m);
  const double r = static_cast<double>(m) * host_float::kInvC[i] - 1.0;
  const double y = static_cast<double>(k) * host_float::kLn2 + host_float::kLogC[i];
  return static_cast<float>(y + host_float::log1p_small(r));
}

}  // namespace dirmult
