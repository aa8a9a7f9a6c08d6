// per_sample_block_avx2: see per_sample_avx2.h. The functions that use AVX2
// carry a target attribute instead of the file a -mavx2 flag: math.h's
// inline functions are then compiled for the baseline ISA wherever they are
// emitted, so no AVX2 code can reach a CPU without it through them.
#include "per_sample_avx2.h"

#include <cmath>

#include "dirmult/math.h"
#include "cpu_simd.h"

namespace dirmult {
namespace cpu {

#ifdef DM_CPU_AVX2

bool per_sample_avx2_available() {
  static const bool available =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_simd_allowed();
  return available;
}

namespace {

#define DM_AVX2 __attribute__((target("avx2,fma")))

// e^x for x in [-87, 88] (exp8_checked redoes the others by dm_exp): 2^k times
// a degree-7 polynomial of the remainder, the Cody-Waite split of ln 2.
// Measured against double exp over 32 M inputs: at most 1.26 ulp.
DM_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

// log x for normal x > 0: the exponent times ln 2 (split) plus a polynomial
// of the mantissa's offset from 1, the mantissa taken in [sqrt(1/2),
// sqrt(2)). Measured against double log over 32 M inputs in [1, 2^100): at
// most 0.79 ulp.
DM_AVX2 inline __m256 log8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  __m256 e = _mm256_cvtepi32_ps(
      _mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  const __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  const __m256 low = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(low, _mm256_set1_ps(1.0f)));
  const __m256 t = _mm256_add_ps(_mm256_sub_ps(m, _mm256_set1_ps(1.0f)), _mm256_and_ps(low, m));
  const __m256 z = _mm256_mul_ps(t, t);
  __m256 y = _mm256_set1_ps(7.0376836292e-2f);
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(-1.1514610310e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(1.1676998740e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(-1.2420140846e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(1.4249322787e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(-1.6668057665e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(2.0000714765e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(-2.4999993993e-1f));
  y = _mm256_fmadd_ps(y, t, _mm256_set1_ps(3.3333331174e-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, t), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(t, y));
}

DM_AVX2 inline __m256d low_pd(__m256 x) { return _mm256_cvtps_pd(_mm256_castps256_ps128(x)); }
DM_AVX2 inline __m256d high_pd(__m256 x) { return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); }

DM_AVX2 inline double hsum(__m256d x) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// e^x for eight lanes; lanes outside exp8's range (tiny, huge, not finite)
// by the scalar exp, as the scalar path has them (denormals, 0, inf, NaN).
DM_AVX2 inline __m256 exp8_checked(__m256 x) {
  const __m256 a = exp8(x);
  const int in_range = _mm256_movemask_ps(
      _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                    _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ)));
  if (in_range == 0xff) return a;
  alignas(32) float ab[8], xb[8];
  _mm256_store_ps(ab, a);
  _mm256_store_ps(xb, x);
  for (int j = 0; j < 8; ++j) {
    if (!((in_range >> j) & 1)) ab[j] = dm_exp(xb[j]);
  }
  return _mm256_load_ps(ab);
}

// Lanes i0 .. i0 + 7 of p[0, m): all eight, or the first m - i0 with zeros
// after them (`in` marks the lanes inside).
DM_AVX2 inline __m256 load_block(const float* p, int i0, int m, __m256& in) {
  const int k = m - i0 < 8 ? m - i0 : 8;
  const __m256i in_i =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  in = _mm256_castsi256_ps(in_i);
  return k == 8 ? _mm256_loadu_ps(p + i0) : _mm256_maskload_ps(p + i0, in_i);
}

// The table test of the GPU kernels (table_index): c + 2^23 holds c in its
// low mantissa bits when c is an integer in [0, 2^23). Returns the lanes
// with integer counts 0 .. kMaxExactCount, their counts in mi (else 0).
DM_AVX2 inline __m256 table_counts(__m256 c, __m256i& mi) {
  const __m256 two23 = _mm256_set1_ps(8388608.0f);
  const __m256 t = _mm256_add_ps(c, two23);
  const __m256i idx = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B000000));
  const __m256i idx_ok =
      _mm256_and_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(-1)),
                       _mm256_cmpgt_epi32(_mm256_set1_epi32(kMaxExactCount + 1), idx));
  const __m256 hit = _mm256_and_ps(_mm256_castsi256_ps(idx_ok),
                                   _mm256_cmp_ps(_mm256_sub_ps(t, two23), c, _CMP_EQ_OQ));
  mi = _mm256_and_si256(idx, _mm256_castps_si256(hit));
  return hit;
}

DM_AVX2 inline int lane_max(__m256i x) {
  alignas(32) int b[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), x);
  int m = 0;
  for (int j = 0; j < 8; ++j) m = b[j] > m ? b[j] : m;
  return m;
}

// The positions i0 + j of the lanes set in mask, appended to rest.
inline void append_lanes(int mask, int i0, uint16_t* rest, int& rests) {
  while (mask != 0) {
    rest[rests++] = static_cast<uint16_t>(i0 + __builtin_ctz(mask));
    mask &= mask - 1;
  }
}

// log n!, n = 0 .. kMaxExactCount: the scalar path's log_factorial values.
struct LogFactorials {
  float v[kMaxExactCount + 1];
  LogFactorials() {
    for (int n = 0; n <= kMaxExactCount; ++n) v[n] = log_factorial(static_cast<float>(n));
  }
};

}  // namespace

DM_AVX2 int per_sample_block_avx2(const float* la, const float* n, int m, bool normalize,
                                  PerSampleBlockSums& sums, uint16_t* rest,
                                  uint16_t* cancelling, int& num_cancelling) {
  static const LogFactorials log_fact;
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  __m256d s_lo = _mm256_setzero_pd(), s_hi = s_lo, a_lo = s_lo, a_hi = s_lo, f_lo = s_lo,
          f_hi = s_lo, c_lo = s_lo, c_hi = s_lo, g_lo = s_lo, g_hi = s_lo;
  __m256 err = zero;
  __m256i counts = _mm256_setzero_si256();
  __m256 finite = zero;  // sum of log_alpha * 0: NaN once one is not finite
  int rests = 0;
  num_cancelling = 0;
  for (int i0 = 0; i0 < m; i0 += 8) {
    // Lanes past m read 0 (a count 0: no term) and are masked out of A.
    __m256 in;
    const __m256 x = load_block(la, i0, m, in);
    const __m256 c = load_block(n, i0, m, in);
    finite = _mm256_fmadd_ps(x, zero, finite);
    const __m256 a = exp8_checked(x);
    const __m256 a_in = _mm256_and_ps(a, in);
    a_lo = _mm256_add_pd(a_lo, low_pd(a_in));
    a_hi = _mm256_add_pd(a_hi, high_pd(a_in));
    __m256i mi;
    const __m256 hit = table_counts(c, mi);
    const __m256 mf = _mm256_cvtepi32_ps(mi);
    // The first factor is log a itself (small), or n log a.
    const Factors8 f8 = exact_factors8(a);
    const __m256 lbase =
        _mm256_and_ps(_mm256_blendv_ps(_mm256_mul_ps(mf, x), x, f8.small),
                      _mm256_cmp_ps(mf, zero, _CMP_NEQ_OQ));
    const int m_max = lane_max(mi);
    __m256 p = one;
    for (int f = 1; f < m_max; ++f) {
      const __m256 kf = _mm256_set1_ps(static_cast<float>(f));
      const __m256 factor = _mm256_fmadd_ps(kf, f8.step, f8.base);
      p = _mm256_blendv_ps(p, _mm256_mul_ps(p, factor), _mm256_cmp_ps(kf, mf, _CMP_LT_OQ));
    }
    const __m256 term = _mm256_add_ps(lbase, log8(p));
    // lnpoch_exact_cancels: log a < 0, n >= 2 and |term| < 1.
    const __m256 abs_term = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), term);
    const __m256 cancels = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ),
                      _mm256_cmp_ps(mf, _mm256_set1_ps(2.0f), _CMP_GE_OQ)),
        _mm256_cmp_ps(abs_term, one, _CMP_LT_OQ));
    const __m256 keep = _mm256_andnot_ps(cancels, hit);
    const __m256 kept = _mm256_and_ps(term, keep);
    s_lo = _mm256_add_pd(s_lo, low_pd(kept));
    s_hi = _mm256_add_pd(s_hi, high_pd(kept));
    const __m256 kept_abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), kept);
    g_lo = _mm256_add_pd(g_lo, low_pd(kept_abs));
    g_hi = _mm256_add_pd(g_hi, high_pd(kept_abs));
    // The cancelling terms' float32 values and their error bound (units of
    // 2^-24 of 1): 2 per factor (its sum and product), a (exp8, 1.26 ulp)
    // in the factors (a H(m - 1) times, a < 1), log8 (0.79 ulp) of log p <
    // |log a| + 1, the sum: under 2 m + 11 + 2 |log a|.
    const __m256 c_term = _mm256_and_ps(term, cancels);
    c_lo = _mm256_add_pd(c_lo, low_pd(c_term));
    c_hi = _mm256_add_pd(c_hi, high_pd(c_term));
    const __m256 bound = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), _mm256_sub_ps(mf, x),
                                         _mm256_set1_ps(11.0f));
    err = _mm256_add_ps(err, _mm256_and_ps(bound, cancels));
    counts = _mm256_add_epi32(counts, _mm256_and_si256(mi, _mm256_castps_si256(hit)));
    if (normalize) {
      const __m256 lf = _mm256_and_ps(_mm256_i32gather_ps(log_fact.v, mi, 4), hit);
      f_lo = _mm256_add_pd(f_lo, low_pd(lf));
      f_hi = _mm256_add_pd(f_hi, high_pd(lf));
    }
    append_lanes(_mm256_movemask_ps(_mm256_andnot_ps(hit, in)), i0, rest, rests);
    append_lanes(_mm256_movemask_ps(cancels), i0, cancelling, num_cancelling);
  }
  sums.s += hsum(_mm256_add_pd(s_lo, s_hi));
  sums.A += hsum(_mm256_add_pd(a_lo, a_hi));
  sums.norm += hsum(_mm256_add_pd(f_lo, f_hi));
  sums.magnitude += hsum(_mm256_add_pd(g_lo, g_hi));
  sums.cancel_s = hsum(_mm256_add_pd(c_lo, c_hi));
  alignas(32) float eb[8];
  _mm256_store_ps(eb, err);
  sums.cancel_err = ((eb[0] + eb[1]) + (eb[2] + eb[3])) + ((eb[4] + eb[5]) + (eb[6] + eb[7]));
  alignas(32) int cb[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(cb), counts);
  for (int j = 0; j < 8; ++j) sums.N += cb[j];
  alignas(32) float fb[8];
  _mm256_store_ps(fb, finite);
  for (int j = 0; j < 8; ++j) sums.finite = sums.finite && fb[j] == 0.0f;
  return rests;
}

DM_AVX2 int per_sample_grad_block_avx2(const float* la, const float* n, int m, double g, double d,
                                       float* out, uint16_t* rest) {
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  const __m256d gv = _mm256_set1_pd(g), dv = _mm256_set1_pd(d);
  int rests = 0;
  for (int i0 = 0; i0 < m; i0 += 8) {
    __m256 in;
    const __m256 x = load_block(la, i0, m, in);
    const __m256 c = load_block(n, i0, m, in);
    const __m256 a = exp8_checked(x);
    __m256i mi;
    const __m256 hit = table_counts(c, mi);
    const __m256 mf = _mm256_cvtepi32_ps(mi);
    const Factors8 f8 = exact_factors8(a);
    // adpoch_exact's running products: q / p = sum_k 1 / (a + k), scaled.
    const int m_max = lane_max(mi);
    __m256 p = one, q = zero;
    for (int f = 1; f < m_max; ++f) {
      const __m256 kf = _mm256_set1_ps(static_cast<float>(f));
      const __m256 t = _mm256_fmadd_ps(kf, f8.step, f8.base);
      const __m256 use = _mm256_cmp_ps(kf, mf, _CMP_LT_OQ);
      q = _mm256_blendv_ps(q, _mm256_fmadd_ps(q, t, p), use);
      p = _mm256_blendv_ps(p, _mm256_mul_ps(p, t), use);
    }
    const __m256 ad = _mm256_and_ps(
        _mm256_add_ps(one, _mm256_mul_ps(_mm256_blendv_ps(one, a, f8.small), _mm256_div_ps(q, p))),
        _mm256_cmp_ps(mf, zero, _CMP_NEQ_OQ));
    // g (adpoch - a d) in double, as the scalar path.
    const __m128 lo = _mm256_cvtpd_ps(
        _mm256_mul_pd(gv, _mm256_fnmadd_pd(low_pd(a), dv, low_pd(ad))));
    const __m128 hi = _mm256_cvtpd_ps(
        _mm256_mul_pd(gv, _mm256_fnmadd_pd(high_pd(a), dv, high_pd(ad))));
    const __m256 gr = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    _mm256_maskstore_ps(out + i0, _mm256_castps_si256(_mm256_and_ps(hit, in)), gr);
    append_lanes(_mm256_movemask_ps(_mm256_andnot_ps(hit, in)), i0, rest, rests);
  }
  return rests;
}

DM_AVX2 double per_sample_alpha_sum_avx2(const float* la, int64_t m, bool& finite) {
  const __m256 zero = _mm256_setzero_ps();
  __m256d a_lo = _mm256_setzero_pd(), a_hi = a_lo;
  __m256 fin = zero;
  for (int64_t b0 = 0; b0 < m; b0 += kPerSampleBlock) {
    const int k = static_cast<int>(m - b0 < kPerSampleBlock ? m - b0 : kPerSampleBlock);
    for (int i0 = 0; i0 < k; i0 += 8) {
      __m256 in;
      const __m256 x = load_block(la + b0, i0, k, in);
      fin = _mm256_fmadd_ps(x, zero, fin);
      const __m256 a = _mm256_and_ps(exp8_checked(x), in);
      a_lo = _mm256_add_pd(a_lo, low_pd(a));
      a_hi = _mm256_add_pd(a_hi, high_pd(a));
    }
  }
  alignas(32) float fb[8];
  _mm256_store_ps(fb, fin);
  for (int j = 0; j < 8; ++j) finite = finite && fb[j] == 0.0f;
  return hsum(_mm256_add_pd(a_lo, a_hi));
}

#else  // not x86-64: the scalar path only

bool per_sample_avx2_available() { return false; }

int per_sample_block_avx2(const float*, const float*, int, bool, PerSampleBlockSums&,
                          uint16_t*) {
  return -1;
}

int per_sample_grad_block_avx2(const float*, const float*, int, double, double, float*,
                               uint16_t*) {
  return -1;
}

double per_sample_alpha_sum_avx2(const float*, int64_t, bool&) { return 0.0; }

#endif

}  // namespace cpu
}  // namespace dirmult
