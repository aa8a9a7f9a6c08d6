// The Dirichlet-multinomial math, shared by the CPU and CUDA kernels.
//
// Everything is written on the log-rising-factorial (log-Pochhammer) form
//
//   lnpoch(a, n)  = lgamma(a + n) - lgamma(a)
//   adpoch(a, n)  = a * (digamma(a + n) - digamma(a))
//   tpoch(a, n)   = trigamma(a + n) - trigamma(a)  (second derivatives; at the end)
//
// because the naive lgamma/digamma differences lose all their digits in float32
// once a is large (lgamma(1e6 + 1) - lgamma(1e6) is off by 6%), and because
// n = 0 contributes exactly 0 to both, so kernels can skip zero counts.
//
// Three evaluation paths, chosen per term:
//  * n an integer in [1, kMaxExactCount]: an exact finite product (one log).
//    For a < kStirlingMin the factors are (a + k); above it they are
//    (1 + k / a) and n * log(a) is added separately, so nothing overflows.
//    Integers up to kMaxChunkedCount: the same factors, a log per
//    kMaxExactCount of them (lnpoch_chunked).
//  * a >= kStirlingMin, any real n: the difference of two Stirling series,
//    rearranged so that the large parts cancel analytically (log1p form).
//  * a < kStirlingMin, non-integer or large n: shift a up by m integer steps
//    with the recurrence and fall into the Stirling path.
// log(a) is always passed in (the caller holds log_alpha), which keeps tiny
// concentrations exact: lnpoch(a, n) = log(a) + log((a+1)...(a+n-1)).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "host_float.h"

#if defined(__CUDACC__)
#define DM_HOST_DEVICE __host__ __device__ __forceinline__
// The rare paths (non-integer or large counts) stay out of line on the GPU:
// inlining them into every kernel costs registers and compile time.
#define DM_RARE_PATH __host__ __device__ __noinline__ inline
#else
#define DM_HOST_DEVICE inline
#define DM_RARE_PATH inline
#endif

namespace dirmult {

// Counts up to this value (integers) take the exact-product path.
constexpr int kMaxExactCount = 16;
// Entries per column of a lookup table over the exact counts, n = 0 .. kMaxExactCount
// (See Note [Tables]).
constexpr int kTableWidth = kMaxExactCount + 1;
// Integer counts above kMaxExactCount up to these take the exact products
// too, with a log (lnpoch_chunked) or a ratio (adpoch_chunked) per
// kMaxExactCount factors: about n multiplications, against the general
// path's float64 shift recurrence and Stirling series, whose cost does not
// grow with n. The bounds are where the products stop paying: on the GPU
// lnpoch to 128 and adpoch to 64 (the per-sample backward, adpoch alone,
// lost at 65..128); a CPU core runs the products' chain serially, 48 for
// both (docs/PERFORMANCE_LEDGER.md, counts off the tables).
#if defined(__CUDA_ARCH__)
constexpr int kMaxChunkedCount = 128;
constexpr int kMaxChunkedAdpochCount = 64;
#else
constexpr int kMaxChunkedCount = 48;
constexpr int kMaxChunkedAdpochCount = 48;
#endif

template <typename T>
struct Tuning;
template <>
struct Tuning<float> {
  // Stirling with 3 correction terms at x >= 8 is accurate to ~3e-10.
  static constexpr float kStirlingMin = 8.0f;
};
template <>
struct Tuning<double> {
  // Stirling with 5 correction terms at x >= 10 is accurate to ~2e-14.
  static constexpr double kStirlingMin = 10.0;
};

DM_HOST_DEVICE float dm_log(float x) { return logf(x); }
DM_HOST_DEVICE double dm_log(double x) { return log(x); }

// log x for normal finite x > 0 (the exact path's products: >= 1 and
// finite). On the GPU: CUDA 13's logf arithmetic (read from its SASS)
// without the special cases it checks first (subnormal scaling, inf/NaN,
// zero), 17 instructions against 26; the same bits as logf for every such x
// (checked over all of them on the H200: scripts/gpu/check_log_normal.cu).
// Every log of an exact-path product takes it, so the table entries and
// the math path stay the same bits. On the host: host_log_normal (the same
// bits in scalar code and in AVX2 lanes, host_float.h), 0.5 ulp.
DM_HOST_DEVICE float dm_log_normal(float x) {
#if defined(__CUDA_ARCH__)
  // x = 2^e m with m in [2/3, 4/3): log x = e log 2 + log1p(m - 1), the
  // latter f + f^2 P(f) by Horner (the _rn intrinsics are not contracted).
  const int bits = __float_as_int(x);
  const int e = (bits - 0x3f2aaaab) & static_cast<int>(0xff800000u);
  const float f = __fadd_rn(__int_as_float(bits - e), -1.0f);
  float r = __fmaf_rn(f, __int_as_float(0xbe055027), __int_as_float(0x3e1039f6));
  r = __fmaf_rn(f, r, __int_as_float(0xbdf8cdcc));
  r = __fmaf_rn(f, r, __int_as_float(0x3e0f2955));
  r = __fmaf_rn(f, r, __int_as_float(0xbe2ad8b9));
  r = __fmaf_rn(f, r, __int_as_float(0x3e4ced0b));
  r = __fmaf_rn(f, r, __int_as_float(0xbe7fff22));
  r = __fmaf_rn(f, r, __int_as_float(0x3eaaaa78));
  r = __fmaf_rn(f, r, -0.5f);
  r = __fmul_rn(f, r);
  r = __fmaf_rn(f, r, f);
  // (e 2^-23) log 2 + r with the power of two moved onto the constant
  // (log 2 as a float, 0x3f317218, scaled by 2^-23): e is a multiple of
  // 2^23 below 2^31 in magnitude, so both scalings are exact, the product is
  // the same real number and the one rounding gives logf's bits, with one
  // multiply fewer (the table fills take 16 logs per column).
  return __fmaf_rn(__int2float_rn(e), __int_as_float(0x33b17218), r);
#else
  return host_log_normal(x);
#endif
}
DM_HOST_DEVICE double dm_log_normal(double x) { return dm_log(x); }
DM_HOST_DEVICE float dm_log1p(float x) { return log1pf(x); }
DM_HOST_DEVICE double dm_log1p(double x) { return log1p(x); }
// On the host host_exp (the same bits in scalar code and AVX2 lanes,
// host_float.h), 0.5 ulp.
DM_HOST_DEVICE float dm_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return host_exp(x);
#endif
}
DM_HOST_DEVICE double dm_exp(double x) { return exp(x); }
DM_HOST_DEVICE float dm_floor(float x) { return floorf(x); }
DM_HOST_DEVICE double dm_floor(double x) { return floor(x); }
DM_HOST_DEVICE float dm_ceil(float x) { return ceilf(x); }
DM_HOST_DEVICE double dm_ceil(double x) { return ceil(x); }

// A count is usable when it is finite and non-negative; anything else makes
// the row NaN (see the README's "bad input" section).
template <typename T>
DM_HOST_DEVICE bool is_valid_count(T n) {
  return n >= T(0) && n < T(INFINITY);
}
template <typename T>
DM_HOST_DEVICE bool is_finite(T x) {
  return x - x == T(0);
}

// D(x) = lgamma(x) - [(x - 1/2) log x - x + log(2 pi) / 2], x >= kStirlingMin.
DM_HOST_DEVICE float stirling_correction(float x) {
  const float r = 1.0f / x, r2 = r * r;
  return r * (1.0f / 12 - r2 * (1.0f / 360 - r2 * (1.0f / 1260)));
}
DM_HOST_DEVICE double stirling_correction(double x) {
  const double r = 1.0 / x, r2 = r * r;
  return r * (1.0 / 12 -
              r2 * (1.0 / 360 -
                    r2 * (1.0 / 1260 - r2 * (1.0 / 1680 - r2 * (1.0 / 1188)))));
}

// F(x) with digamma(x) = log x - 1/(2x) - F(x), x >= kStirlingMin.
DM_HOST_DEVICE float digamma_correction(float x) {
  const float r2 = 1.0f / (x * x);
  return r2 * (1.0f / 12 - r2 * (1.0f / 120 - r2 * (1.0f / 252)));
}
DM_HOST_DEVICE double digamma_correction(double x) {
  const double r2 = 1.0 / (x * x);
  return r2 * (1.0 / 12 -
               r2 * (1.0 / 120 -
                     r2 * (1.0 / 252 - r2 * (1.0 / 240 - r2 * (1.0 / 132)))));
}

// ---------------------------------------------------------------------------
// Exact path: integer n in [1, kMaxExactCount].
//
// Factors f_k = (a + k) * s for k = 1..n-1 with s = 1 (small a) or s = 1/a
// (large a); P = prod f_k and Q = dP/d(a*s)-style running sum give
//   lnpoch = (small ? log a : n log a) + log P
//   adpoch = small ? 1 + a * Q / P : 1 + Q / P
// where Q / P = sum_k 1 / f_k. The product form needs one log per term
// instead of n, and the large-a scaling keeps P within (1, 3^16).
// ---------------------------------------------------------------------------
template <typename T>
struct ExactFactors {
  T base;   // f_0 offset: a (small) or 1 (large)
  T step;   // per-k increment: 1 (small) or 1/a (large)
  bool small;
};

template <typename T>
DM_HOST_DEVICE ExactFactors<T> exact_factors(T a) {
  const bool small = a < Tuning<T>::kStirlingMin;
  return {small ? a : T(1), small ? T(1) : T(1) / a, small};
}

// c ? x : y, on the host by a mask of the bits: GCC turns a float ternary
// into a branch (without SSE4.1's blends), which mispredicts on random c.
template <typename T>
DM_HOST_DEVICE T dm_select(bool c, T x, T y) {
#if defined(__CUDA_ARCH__)
  return c ? x : y;
#else
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  static_assert(sizeof(T) == sizeof(U), "float or double");
  U ux, uy;
  std::memcpy(&ux, &x, sizeof ux);
  std::memcpy(&uy, &y, sizeof uy);
  const U mask = U(0) - static_cast<U>(c);
  const U r = (ux & mask) | (uy & ~mask);
  T out;
  std::memcpy(&out, &r, sizeof out);
  return out;
#endif
}

// The same with inv_a = 1 / a from the caller, computed whatever a is, and
// no branch on a < kStirlingMin (the CPU's SharedAlpha: where a straddles
// it at random the branch mispredicts; docs/PERFORMANCE_LEDGER.md, CPU).
template <typename T>
DM_HOST_DEVICE ExactFactors<T> exact_factors(T a, T inv_a) {
  const bool small = a < Tuning<T>::kStirlingMin;
  return {dm_select(small, a, T(1)), dm_select(small, T(1), inv_a), small};
}

template <typename T>
DM_HOST_DEVICE T lnpoch_exact(const ExactFactors<T>& f, T log_a, int n) {
  T p = T(1);
  for (int k = 1; k < n; ++k) p *= f.base + T(k) * f.step;
  return (f.small ? log_a : T(n) * log_a) + dm_log_normal(p);
}

template <typename T>
DM_HOST_DEVICE T adpoch_exact(const ExactFactors<T>& f, T a, int n) {
  T p = T(1), q = T(0);
  for (int k = 1; k < n; ++k) {
    const T t = f.base + T(k) * f.step;
    q = q * t + p;
    p *= t;
  }
  return T(1) + (f.small ? a : T(1)) * (q / p);
}

// ---------------------------------------------------------------------------
// Stirling path: a >= kStirlingMin, any real n >= 0.
//   lnpoch = n log a + (a + n - 1/2) log1p(n/a) - n + D(a+n) - D(a)
//   dpoch  = log1p(n/a) + n / (2 a (a+n)) + F(a) - F(a+n)
// ---------------------------------------------------------------------------
template <typename T>
DM_HOST_DEVICE T lnpoch_stirling(T a, T log_a, T n) {
  const T x = n / a;
  return n * log_a + ((a + n - T(0.5)) * dm_log1p(x) - n) +
         (stirling_correction(a + n) - stirling_correction(a));
}

template <typename T>
DM_HOST_DEVICE T dpoch_stirling(T a, T n) {
  const T x = n / a;
  return dm_log1p(x) + T(0.5) * x / (a + n) +
         (digamma_correction(a) - digamma_correction(a + n));
}

// ---------------------------------------------------------------------------
// General path: any a > 0, any real n > 0.
// For small a, shift by m = ceil(kStirlingMin - a) steps:
//   lnpoch(a, n) = lnpoch(a+m, n) + lnpoch(a, m) - lnpoch(a+n, m)
// ---------------------------------------------------------------------------
template <typename T>
DM_RARE_PATH T lnpoch_general(T a, T log_a, T n) {
  const T lo = Tuning<T>::kStirlingMin;
  // a overflowed (log a beyond the dtype's exp range): lnpoch = n log a +
  // n (n - 1) / (2 a) + ..., whose correction is 0 at this a.
  if (a == T(INFINITY)) return n * log_a;
  if (a >= lo) return lnpoch_stirling(a, log_a, n);
  const int m = static_cast<int>(dm_ceil(lo - a));
  const T am = a + T(m);
  // lnpoch(a, m) = log a + log prod_{k=1}^{m-1} (a + k)
  T p1 = T(1);
  for (int k = 1; k < m; ++k) p1 *= a + T(k);
  // lnpoch(a+n, m) = m log(a+n) + log prod_{k<m} (1 + k/(a+n)): no overflow
  // however large n is.
  const T an = a + n;
  T p2 = T(1);
  for (int k = 1; k < m; ++k) p2 *= T(1) + T(k) / an;
  return lnpoch_stirling(am, dm_log(am), n) +
         ((log_a + dm_log(p1)) - (T(m) * dm_log(an) + dm_log(p2)));
}

template <typename T>
DM_RARE_PATH T adpoch_general(T a, T n) {
  const T lo = Tuning<T>::kStirlingMin;
  if (a == T(INFINITY)) return n;  // the limit of a dpoch(a, n) (inf * 0 below)
  if (a >= lo) return a * dpoch_stirling(a, n);
  const int m = static_cast<int>(dm_ceil(lo - a));
  // a * sum_{k<m} [1/(a+k) - 1/(a+n+k)] = n/(a+n) + sum_{k>=1} a n / ((a+k)(a+n+k)),
  // written without the cancelling difference.
  T s = n / (a + n);
  for (int k = 1; k < m; ++k) s += a * n / ((a + T(k)) * (a + n + T(k)));
  return a * dpoch_stirling(a + T(m), n) + s;
}

// float32 callers take the rare paths in double: they subtract quantities of
// similar size (the shift recurrence against the Stirling difference), and
// double keeps the float32 result within an ulp or two of the true value.
template <>
DM_RARE_PATH float lnpoch_general<float>(float a, float log_a, float n) {
  return static_cast<float>(lnpoch_general<double>(dm_exp(static_cast<double>(log_a)),
                                                   static_cast<double>(log_a),
                                                   static_cast<double>(n)));
}
template <>
DM_RARE_PATH float adpoch_general<float>(float a, float n) {
  return static_cast<float>(adpoch_general<double>(static_cast<double>(a), static_cast<double>(n)));
}

// The exact path cancels when a < 1 and a (a+1) ... (a+n-1) is near 1
// (log a against log of the product): there float32 recomputes in double,
// from log a (the caller's input), so the result keeps its relative accuracy.
DM_RARE_PATH double lnpoch_exact_refined(double log_a, int n) {
  const double a = dm_exp(log_a);
  double p = 1.0;
  for (int k = 1; k < n; ++k) p *= a + k;
  return log_a + dm_log(p);
}

// Whether lnpoch_exact's result r needs lnpoch_exact_refined. Only log a < 0
// with a product (n >= 2) can cancel; n = 1 is log a itself.
template <typename T>
DM_HOST_DEVICE bool lnpoch_exact_cancels(T log_a, int n, T r) {
  // (|r| < 1: on the GPU one comparison, |r| an operand modifier; & rather
  // than &&, so that no operand is evaluated conditionally.)
  return sizeof(T) == sizeof(float) && ((log_a < T(0)) & (n >= 2) & (std::fabs(r) < T(1)));
}

// The per-sample float32 forwards (forward_per_sample_float_kernel and
// per_sample_sums_avx2) keep the float32 values of cancelling terms where
// the error bound of those kept, in units of 2^-24, stays within this many
// times the sum of the row piece's |terms| so far, i.e. within 2^-22 of the
// row's magnitudes, the measure its accuracy is stated in
// (tests/reference.py); else they take lnpoch_exact_refined.
constexpr float kKeptCancelErrorBudget = 4.0f;

template <typename T>
DM_HOST_DEVICE T lnpoch_exact_checked(const ExactFactors<T>& f, T log_a, int n) {
  T r = lnpoch_exact(f, log_a, n);
  if (lnpoch_exact_cancels(log_a, n, r)) {
    r = static_cast<T>(lnpoch_exact_refined(static_cast<double>(log_a), n));
  }
  return r;
}

// The exact-path values of one concentration for n = 1 .. kMaxExactCount
// (the lookup tables' entries) come from running products over k = 1 .. n -
// 1: P = prod f_k and Q, multiplied as in lnpoch_exact and adpoch_exact (so
// each entry is the value those give for that n), and n! = prod (1 + k)
// (log n! is lnpoch(1, n) the same way). ExactRun is that state;
// exact_run_step takes factor n; exact_run_value is entry n.
template <typename T>
struct ExactRun {
  T p = T(1), q = T(0), fact = T(1);
};

template <typename T>
DM_HOST_DEVICE void exact_run_step(const ExactFactors<T>& f, int n, ExactRun<T>& run) {
  const T t = f.base + T(n) * f.step;
  run.q = run.q * t + run.p;
  run.p *= t;
  run.fact *= T(1) + T(n) * T(1);
}

// lnpoch(a, n), n >= 1, from the state after factors 1 .. n - 1, before the
// refinement that lnpoch_exact_cancels asks for.
template <typename T>
DM_HOST_DEVICE T exact_run_lnpoch(const ExactRun<T>& run, const ExactFactors<T>& f, T log_a,
                                  int n) {
#if defined(__CUDA_ARCH__)
  // The same value as below in one multiply-add instead of a multiply and a
  // select (the fill's loop over n takes the two selects out): 0 n + log a
  // is log a exactly, and log a n + 0 is the product rounded once.
  const T leading = fma(f.small ? T(0) : log_a, T(n), f.small ? log_a : T(0));
#else
  const T leading = f.small ? log_a : T(n) * log_a;
#endif
  return leading + dm_log_normal(run.p);
}

// Entry n >= 1 from the state after factors 1 .. n - 1: lnpoch(a, n) [- log
// n! when normalize] (log_poch) or a dpoch(a, n). (run.fact's log is
// log_factorial(n), the same products.)
template <typename T>
DM_HOST_DEVICE T exact_run_value(const ExactRun<T>& run, const ExactFactors<T>& f, T a, T log_a,
                                 int n, bool log_poch, bool normalize) {
  if (!log_poch) return T(1) + (f.small ? a : T(1)) * (run.q / run.p);
  T r = exact_run_lnpoch(run, f, log_a, n);
  if (lnpoch_exact_cancels(log_a, n, r)) {
    r = static_cast<T>(lnpoch_exact_refined(static_cast<double>(log_a), n));
  }
  if (normalize) r -= dm_log_normal(run.fact);
  return r;
}

// ---------------------------------------------------------------------------
// Chunked exact path: integer n in (kMaxExactCount, kMaxChunkedCount]
// (lnpoch) or (kMaxExactCount, kMaxChunkedAdpochCount] (adpoch).
// The factors of lnpoch_exact and adpoch_exact, kMaxExactCount at a time, so
// that no product overflows (for a < kStirlingMin each factor is below
// kStirlingMin + kMaxChunkedCount: 136^16 < 1.4e34; above it below 17), a
// log (or a ratio q / p) per chunk. Out of line: counts off the tables.
// ---------------------------------------------------------------------------
template <int kMax, typename T>
DM_HOST_DEVICE bool is_chunked_count(T n) {
  return n <= T(kMax) && n == dm_floor(n);
}

// Factors k and k + 1 of a chunk go to two products, so that the chain of
// dependent multiplications is half as long (the CPU runs it serially).
template <typename T>
DM_HOST_DEVICE T lnpoch_chunked(const ExactFactors<T>& f, T log_a, int n) {
  T logp = T(0);
  for (int k0 = 1; k0 < n; k0 += kMaxExactCount) {
    const int k1 = k0 + kMaxExactCount < n ? k0 + kMaxExactCount : n;
    T p0 = T(1), p1 = T(1);
    int k = k0;
    for (; k + 1 < k1; k += 2) {
      p0 *= f.base + T(k) * f.step;
      p1 *= f.base + T(k + 1) * f.step;
    }
    if (k < k1) p0 *= f.base + T(k) * f.step;
    logp += dm_log_normal(p0 * p1);
  }
  T r = (f.small ? log_a : T(n) * log_a) + logp;
  // log a against the log of at least 16! (a < 1e-13): recomputed in double.
  if (lnpoch_exact_cancels(log_a, n, r)) {
    r = static_cast<T>(lnpoch_exact_refined(static_cast<double>(log_a), n));
  }
  return r;
}

template <typename T>
DM_HOST_DEVICE T adpoch_chunked(const ExactFactors<T>& f, T a, int n) {
  T ratio = T(0);  // sum_k 1 / f_k, a chunk's q / p at a time
  for (int k0 = 1; k0 < n; k0 += kMaxExactCount) {
    const int k1 = k0 + kMaxExactCount < n ? k0 + kMaxExactCount : n;
    T p0 = T(1), q0 = T(0), p1 = T(1), q1 = T(0);  // q / p = sum of 1 / t
    int k = k0;
    for (; k + 1 < k1; k += 2) {
      const T t0 = f.base + T(k) * f.step, t1 = f.base + T(k + 1) * f.step;
      q0 = q0 * t0 + p0;
      p0 *= t0;
      q1 = q1 * t1 + p1;
      p1 *= t1;
    }
    if (k < k1) {
      const T t0 = f.base + T(k) * f.step;
      q0 = q0 * t0 + p0;
      p0 *= t0;
    }
    ratio += (q0 * p1 + q1 * p0) / (p0 * p1);
  }
  return T(1) + (f.small ? a : T(1)) * ratio;
}

// ---------------------------------------------------------------------------
// Entry points. a > 0, log_a = log(a), n >= 0 (callers check validity).
// ---------------------------------------------------------------------------
template <typename T>
DM_HOST_DEVICE bool is_exact_count(T n) {
  return n <= T(kMaxExactCount) && n == dm_floor(n);
}

// Counts off the exact path: the chunked products or the general path, one
// out-of-line call from the kernels (a call site per path made ptxas save
// more registers around them: 48-byte spills in the per-sample forward).
template <typename T>
DM_RARE_PATH T lnpoch_off_exact(const ExactFactors<T>& f, T a, T log_a, T n) {
  if (is_chunked_count<kMaxChunkedCount>(n)) return lnpoch_chunked(f, log_a, static_cast<int>(n));
  return lnpoch_general(a, log_a, n);
}

template <typename T>
DM_RARE_PATH T adpoch_off_exact(const ExactFactors<T>& f, T a, T n) {
  if (is_chunked_count<kMaxChunkedAdpochCount>(n)) {
    return adpoch_chunked(f, a, static_cast<int>(n));
  }
  return adpoch_general(a, n);
}

template <typename T>
DM_HOST_DEVICE T lnpoch(T a, T log_a, T n) {
  if (n == T(0)) return T(0);
  if (is_exact_count(n)) {
    return lnpoch_exact_checked(exact_factors(a), log_a, static_cast<int>(n));
  }
  return lnpoch_off_exact(exact_factors(a), a, log_a, n);
}

// Same, with the per-column factors precomputed by the caller.
template <typename T>
DM_HOST_DEVICE T lnpoch(const ExactFactors<T>& f, T a, T log_a, T n) {
  if (n == T(0)) return T(0);
  if (is_exact_count(n)) return lnpoch_exact_checked(f, log_a, static_cast<int>(n));
  return lnpoch_off_exact(f, a, log_a, n);
}

template <typename T>
DM_HOST_DEVICE T adpoch(T a, T n) {
  if (n == T(0)) return T(0);
  if (is_exact_count(n)) {
    return adpoch_exact(exact_factors(a), a, static_cast<int>(n));
  }
  return adpoch_off_exact(exact_factors(a), a, n);
}

template <typename T>
DM_HOST_DEVICE T adpoch(const ExactFactors<T>& f, T a, T n) {
  if (n == T(0)) return T(0);
  if (is_exact_count(n)) return adpoch_exact(f, a, static_cast<int>(n));
  return adpoch_off_exact(f, a, n);
}

// digamma(a + n) - digamma(a), for a > 0 (row terms: a = A, n = N).
template <typename T>
DM_HOST_DEVICE T dpoch(T a, T n) {
  if (n == T(0)) return T(0);
  return adpoch(a, n) / a;
}

// ---------------------------------------------------------------------------
// The concentration total A = sum_v exp(log_alpha_v) of a row or component.
// Kernels sum the dtype's exps in double; that sum is A unless log alpha
// leaves the dtype's exp range: exps that overflow make it inf, and where
// every alpha is tiny (subnormal or flushed to 0) it is 0 or loses its
// digits. There (`scaled`) log A is taken as a log-sum-exp of log_alpha in
// double and A = exp(log A) (0 or inf where it leaves double's range too):
// the row term lnpoch(A, N) is right from log A (the exact path's log a and
// n log a, the general path's limits above), and the gradient's
// a_v dpoch(A, N) is written (a_v / A) adpoch(A, N), both finite.
// ---------------------------------------------------------------------------
template <typename T>
struct TotalRange;
template <>
struct TotalRange<float> {
  // Float32 exps below 2^-126 are subnormal (an absolute error of 2^-150
  // each): from A >= 2^-90 they move A by under 2^-60 V relatively.
  static constexpr double kMin = 0x1p-90;
};
template <>
struct TotalRange<double> {
  static constexpr double kMin = 0x1p-960;
};

struct LogTotal {
  double A, log_A;
  bool scaled;

  // The row's weight in the gradient of log_alpha: dpoch(A, N), or
  // adpoch(A, N) = A dpoch(A, N) where scaled.
  DM_HOST_DEVICE double row_weight(double N) const;
  // The factor of column v's row weight: a_v, or a_v / A where scaled.
  template <typename T>
  DM_HOST_DEVICE double column_factor(T a, T log_a) const {
    return scaled ? dm_exp(static_cast<double>(log_a) - log_A) : static_cast<double>(a);
  }
};

// Whether a sum of the dtype's exps A needs the log-space total (NaN: no,
// it stays NaN).
template <typename T>
DM_HOST_DEVICE bool total_out_of_range(double A) {
  return A < TotalRange<T>::kMin || A == double(INFINITY);
}

// The total from the kernels' sum A; lse() gives log A from log_alpha when
// A is out of range (called only then).
template <typename T, typename Lse>
DM_HOST_DEVICE LogTotal make_log_total(double A, Lse lse) {
  if (!total_out_of_range<T>(A)) return {A, dm_log(A), false};
  const double l = lse();
  return {dm_exp(l), l, true};
}

// log sum_i exp(la[i * stride]), i < n, in double (NaN if any is NaN).
template <typename T>
inline double log_sum_exp(const T* la, int64_t n, int64_t stride = 1) {
  double m = -double(INFINITY);
  for (int64_t i = 0; i < n; ++i) {
    const double l = static_cast<double>(la[i * stride]);
    if (l != l) return l;
    m = l > m ? l : m;
  }
  if (!(m > -double(INFINITY) && m < double(INFINITY))) return m;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += dm_exp(static_cast<double>(la[i * stride]) - m);
  return m + dm_log(s);
}

// log(n!) = lnpoch(1, n): the multinomial coefficient's pieces.
template <typename T>
DM_HOST_DEVICE T log_factorial(T n) {
  return lnpoch(T(1), T(0), n);
}

DM_HOST_DEVICE double LogTotal::row_weight(double N) const {
  return scaled ? adpoch<double>(A, N) : dpoch<double>(A, N);
}

// digamma(x), x > 0: recurrence up to kStirlingMin, then the series.
template <typename T>
DM_RARE_PATH T digamma(T x) {
  if (!(x > T(0)) || !is_finite(x)) return x == T(INFINITY) ? x : T(NAN);
  T shift = T(0);
  while (x < Tuning<T>::kStirlingMin) {
    shift += T(1) / x;
    x += T(1);
  }
  return dm_log(x) - T(0.5) / x - digamma_correction(x) - shift;
}

// ---------------------------------------------------------------------------
// Second derivatives (the double backward). See Note [Trigamma terms].
//
//   tpoch(a, n)   = psi1(a + n) - psi1(a)   (= -sum_{k<n} 1/(a+k)^2 for integer n)
//   a2tpoch(a, n) = a^2 tpoch(a, n)         in [-max(1, n), 0]
//   dadpoch(a, n) = d adpoch(a, n) / d log a = a2tpoch(a, n) + adpoch(a, n)
//
// Both are evaluated in float64 for either dtype (float32 rounds the float64
// result once): the paths' few cancelling steps then stay far below a
// float32 ulp, and their one caller, the double backward, is torch ops
// around an elementwise pass rather than a fused kernel.
//  * n an integer in [1, kMaxExactCount]: exact sums over k = 1 .. n - 1 of
//    positive terms, r_k = a / (a + k), s_k = k / (a + k):
//      a2tpoch = -1 - sum r_k^2,   dadpoch = sum r_k s_k.
//  * a >= kTpochAsymptoticMin, any real n: the differences of the trigamma
//    and digamma asymptotic series, each power difference written as
//      (a + n)^-j - a^-j = -a^-j w G_j(u),  w = n/(a+n), u = a/(a+n),
//      G_j(u) = 1 + u + ... + u^(j-1),
//    so that nothing cancels but what cancels analytically:
//      a2tpoch = -w [a + (1 + u)/2 + sum_k B_2k a^(1-2k) G_(2k+1)(u)]
//      dadpoch = a f(w) - w u / 2 - w sum_k B_2k a^(1-2k) H_k(u)
//    with f(w) = -log(1 - w) - w (a series in z = w / (2 - w) for w <= 1/2)
//    and H_k = G_(2k+1) - G_(2k) / (2k) (positive coefficients).
//  * a < kTpochAsymptoticMin, non-integer or large n: shift a up by m steps,
//    rho = a / (a + m), with p_k = (a+k)/(a+n+k), q_k = n/(a+n+k):
//      a2tpoch(a, n) = rho^2 a2tpoch(a+m, n) - sum_{k<m} r_k^2 q_k (1 + p_k)
//      dadpoch(a, n) = rho dadpoch(a+m, n) - rho (1 - rho) a2tpoch(a+m, n)
//                      + sum_{k<m} r_k q_k (k (n+k) - a^2) / ((a+k)(a+n+k))
//    (the k = 0 terms, -n (2a+n)/(a+n)^2 and -a n/(a+n)^2, have no 1/a^2).
// ---------------------------------------------------------------------------

// Series through B_14 at x >= 16: the first term left out (B_16) is below
// 1e-17 of either result.
constexpr double kTpochAsymptoticMin = 16.0;

struct TpochTerms {
  double a2tpoch;
  double dadpoch;
};

// (The k >= 1 terms are summed before the k = 0 term, -1, is added: for
// small a they are far below it, and adding each to -1 would round each.)
DM_HOST_DEVICE TpochTerms tpoch_terms_exact(double a, int n) {
  double t = 0.0, d = 0.0;
  for (int k = 1; k < n; ++k) {
    const double inv = 1.0 / (a + k);
    const double r = a * inv, s = k * inv;
    t += r * r;
    d += r * s;
  }
  return {-(1.0 + t), d};
}

// f(w) = -log(1 - w) - w, w in [0, 1), from n and a + n directly.
DM_HOST_DEVICE double log1m_excess(double w, double u, double z) {
  if (w > 0.5) return -dm_log(u) - w;
  // -log(1 - w) = 2 atanh(z): f = w z + 2 (z^3/3 + z^5/5 + ...), z <= 1/3.
  const double z2 = z * z;
  double term = z * z2, sum = 0.0;
  for (int k = 3; k < 80; k += 2) {
    const double piece = term / k;
    sum += piece;
    if (piece <= 1e-18 * sum) break;
    term *= z2;
  }
  return w * z + 2.0 * sum;
}

DM_HOST_DEVICE TpochTerms tpoch_terms_asymptotic(double a, double n) {
  // B_2k for k = 1 .. 7.
  constexpr double kB[7] = {1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730,
                            7.0 / 6};
  const double an = a + n;
  const double w = n / an, u = a / an, z = n / (a + an);
  const double inv_a2 = 1.0 / (a * a);
  // G_j(u) for j = 2k and 2k + 1, built up as k grows.
  double g = 1.0 + u, upow = u * u;  // G_2, u^2
  double st = 0.0, sd = 0.0, scale = 1.0 / a;  // scale = a^(1 - 2k)
  for (int k = 1; k <= 7; ++k) {
    const double g_even = g;         // G_2k
    const double g_odd = g + upow;   // G_(2k+1)
    st += kB[k - 1] * scale * g_odd;
    sd += kB[k - 1] * scale * (g_odd - g_even / (2 * k));
    g = g_odd + upow * u;            // G_(2k+2)
    upow *= u * u;
    scale *= inv_a2;
  }
  const double a2t = -w * ((a + 0.5 * (1.0 + u)) + st);
  const double dad = (a * log1m_excess(w, u, z) - 0.5 * w * u) - w * sd;
  return {a2t, dad};
}

DM_RARE_PATH TpochTerms tpoch_terms_general(double a, double n) {
  if (a >= kTpochAsymptoticMin) return tpoch_terms_asymptotic(a, n);
  const int m = static_cast<int>(dm_ceil(kTpochAsymptoticMin - a));
  const double am = a + m;
  const TpochTerms up = tpoch_terms_asymptotic(am, n);
  const double rho = a / am, one_m_rho = m / am;
  // The terms summed from the smallest (the shifted value, k = m - 1) to
  // the largest for small a, k = 0 (with r_0 = 1 taken out, so that a = 0
  // gives the limit rather than 0/0).
  const double an = a + n;
  double t = -rho * rho * up.a2tpoch;
  double d = rho * up.dadpoch - rho * one_m_rho * up.a2tpoch;
  for (int k = m - 1; k >= 1; --k) {
    const double ak = a + k, ank = an + k;
    const double r = a / ak, q = n / ank, p = ak / ank;
    t += r * r * q * (1.0 + p);
    d += r * q * ((k * (n + k) - a * a) / (ak * ank));
  }
  const double q0 = n / an, p0 = a / an;
  return {-(q0 * (1.0 + p0) + t), d - q0 * p0};
}

// (a2tpoch(a, n), dadpoch(a, n)) with a = exp(log_a), n >= 0 (NaN for an
// invalid n).
template <typename T>
DM_HOST_DEVICE TpochTerms tpoch_terms(T log_a, T n) {
  if (n == T(0)) return {0.0, 0.0};
  if (!is_valid_count(n)) return {NAN, NAN};
  const double a = dm_exp(static_cast<double>(log_a)), nd = static_cast<double>(n);
  if (is_exact_count(n)) return tpoch_terms_exact(a, static_cast<int>(n));
  return tpoch_terms_general(a, nd);
}

// tpoch(a, n) itself (-> -1/a^2 as a -> 0: overflows float32 below a ~ 1e-19).
template <typename T>
DM_HOST_DEVICE T tpoch(T log_a, T n) {
  const double a = dm_exp(static_cast<double>(log_a));
  return static_cast<T>(tpoch_terms(log_a, n).a2tpoch / (a * a));
}

}  // namespace dirmult
