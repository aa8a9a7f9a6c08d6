// shared_lnpoch8_avx2: see shared_rows_avx2.h. As in per_sample_avx2.cpp, the
// AVX2 functions carry a target attribute instead of the file a -mavx2
// flag, so math.h's inline functions are emitted for the baseline ISA. The
// CPU sources are built with -ffp-contract=off: the products and the log
// below are the scalar path's multiplies and adds, unfused, so its bits.
#include "shared_rows_avx2.h"

#include <algorithm>

#include "dirmult/host_float.h"
#include "dirmult/math.h"
#include "cpu_simd.h"

namespace dirmult {
namespace cpu {

#ifdef DM_CPU_AVX2

bool shared_rows_avx2_available() {
  static const bool available = __builtin_cpu_supports("avx2") && cpu_simd_allowed();
  return available;
}

namespace {

#define DM_AVX2 __attribute__((target("avx2")))

// host_log_normal of four floats (bits: their bit patterns), in double
// lanes: the same operations in the same order.
DM_AVX2 inline __m128 host_log4(__m128i bits) {
  const __m128i k = _mm_sub_epi32(_mm_srli_epi32(bits, 23), _mm_set1_epi32(127));
  const __m128i i = _mm_and_si128(_mm_srli_epi32(bits, 23 - host_float::kTableBits),
                                  _mm_set1_epi32((1 << host_float::kTableBits) - 1));
  const __m128 m = _mm_castsi128_ps(
      _mm_or_si128(_mm_and_si128(bits, _mm_set1_epi32(0x007fffff)), _mm_set1_epi32(0x3f800000)));
  // (The masked form: GCC warns that the plain one reads an uninitialized
  // source.)
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  const __m256d inv_c = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), host_float::kInvC, i, all, 8);
  const __m256d log_c = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), host_float::kLogC, i, all, 8);
  const __m256d r = _mm256_sub_pd(_mm256_mul_pd(_mm256_cvtps_pd(m), inv_c), _mm256_set1_pd(1.0));
  const __m256d y =
      _mm256_add_pd(_mm256_mul_pd(_mm256_cvtepi32_pd(k), _mm256_set1_pd(host_float::kLn2)), log_c);
  // host_float::log1p_small
  __m256d q = _mm256_sub_pd(_mm256_mul_pd(r, _mm256_set1_pd(0.2)), _mm256_set1_pd(0.25));
  q = _mm256_add_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(host_float::kThird));
  q = _mm256_sub_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(0.5));
  const __m256d l = _mm256_add_pd(r, _mm256_mul_pd(_mm256_mul_pd(r, r), q));
  return _mm256_cvtpd_ps(_mm256_add_pd(y, l));
}

// host_exp of four floats, in double lanes: the same operations in the
// same order (NaN lanes: x itself, as host_exp returns it).
DM_AVX2 inline __m128 host_exp4(__m128 x) {
  const __m128 xc = _mm_min_ps(_mm_max_ps(x, _mm_set1_ps(host_float::kExpMin)),
                               _mm_set1_ps(host_float::kExpMax));
  const __m256d t = _mm256_mul_pd(_mm256_cvtps_pd(xc), _mm256_set1_pd(host_float::k64OverLn2));
  const __m256d kd = _mm256_round_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i k = _mm256_cvtpd_epi32(kd);  // (integers: exact)
  const __m256d y = _mm256_mul_pd(_mm256_sub_pd(t, kd), _mm256_set1_pd(host_float::kLn2Over64));
  // host_float::expm_small
  __m256d q = _mm256_add_pd(_mm256_mul_pd(y, _mm256_set1_pd(host_float::kTwentyFourth)),
                            _mm256_set1_pd(host_float::kSixth));
  q = _mm256_add_pd(_mm256_mul_pd(q, y), _mm256_set1_pd(0.5));
  q = _mm256_add_pd(_mm256_mul_pd(q, y), _mm256_set1_pd(1.0));
  const __m256d p = _mm256_add_pd(_mm256_mul_pd(q, y), _mm256_set1_pd(1.0));
  const __m128i j = _mm_and_si128(k, _mm_set1_epi32((1 << host_float::kExpTableBits) - 1));
  const __m256d all = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
  const __m256d two_j = _mm256_mask_i32gather_pd(_mm256_setzero_pd(), host_float::kExp2, j, all, 8);
  const __m128i k_hi = _mm_srai_epi32(k, host_float::kExpTableBits);
  const __m256i e = _mm256_slli_epi64(_mm256_cvtepi32_epi64(k_hi), 52);
  const __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(_mm256_castpd_si256(two_j), e));
  const __m128 r = _mm256_cvtpd_ps(_mm256_mul_pd(scale, p));
  return _mm_blendv_ps(r, x, _mm_cmpunord_ps(x, x));
}

DM_AVX2 inline __m256 host_log8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m128 lo = host_log4(_mm256_castsi256_si128(bits));
  const __m128 hi = host_log4(_mm256_extracti128_si256(bits, 1));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

// lnpoch_exact_cancels for r of a count >= 2: log a < 0 and |r| < 1.
DM_AVX2 inline __m256 cancels8(__m256 la, __m256 r) {
  return _mm256_and_ps(_mm256_cmp_ps(la, _mm256_setzero_ps(), _CMP_LT_OQ),
                       _mm256_and_ps(_mm256_cmp_ps(r, _mm256_set1_ps(1.0f), _CMP_LT_OQ),
                                     _mm256_cmp_ps(r, _mm256_set1_ps(-1.0f), _CMP_GT_OQ)));
}

// The lanes of n that are integers 1..16 (exact), as a mask and as bits,
// the lanes that are not 0 (NaN included), and the largest exact count.
struct ExactLanes8 {
  __m256 exact;
  unsigned exact_bits, nonzero;
  int top;
};

DM_AVX2 inline ExactLanes8 exact_lanes8(const float* n_in, __m256 n) {
  // Integers 1..16: n + 2^23 puts the rounded integer in the low mantissa
  // bits; it is n exactly iff n is an integer (table_index's test).
  const __m256 two23 = _mm256_set1_ps(8388608.0f);
  const __m256 t = _mm256_add_ps(n, two23);
  const __m256i idx = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4b000000));
  const __m256i in_range = _mm256_andnot_si256(
      _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(kMaxExactCount)),
      _mm256_cmpgt_epi32(idx, _mm256_setzero_si256()));
  ExactLanes8 e;
  e.exact = _mm256_and_ps(_mm256_castsi256_ps(in_range),
                          _mm256_cmp_ps(_mm256_sub_ps(t, two23), n, _CMP_EQ_OQ));
  e.nonzero = static_cast<unsigned>(
      _mm256_movemask_ps(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_NEQ_UQ)));
  e.exact_bits = static_cast<unsigned>(_mm256_movemask_ps(e.exact));
  e.top = 0;
  for (int j = 0; j < 8; ++j) {
    if (e.exact_bits >> j & 1) e.top = std::max(e.top, static_cast<int>(n_in[j]));
  }
  return e;
}

}  // namespace

DM_AVX2 void shared_lnpoch8_avx2(const float* a_in, const float* la_in, const float* n_in,
                                 float* term, unsigned& nonzero, unsigned& done) {
  const __m256 n = _mm256_loadu_ps(n_in);
  const ExactLanes8 e = exact_lanes8(n_in, n);
  const __m256 exact = e.exact;
  const unsigned exact_bits = e.exact_bits;
  const int top = e.top;
  nonzero = e.nonzero;
  done = 0;
  if (exact_bits == 0) {
    _mm256_storeu_ps(term, _mm256_setzero_ps());
    return;
  }
  const __m256 la = _mm256_loadu_ps(la_in);
  const __m256 one = _mm256_set1_ps(1.0f);
  const Factors8 f = exact_factors8(_mm256_loadu_ps(a_in));
  // lnpoch_exact: the product of factors 1 .. n - 1 (the lanes past their
  // count keep theirs), then its log.
  const __m256 nn = _mm256_and_ps(exact, n);
  __m256 p = one;
  for (int k = 1; k < top; ++k) {
    const __m256 kf = _mm256_set1_ps(static_cast<float>(k));
    const __m256 t = _mm256_add_ps(f.base, _mm256_mul_ps(kf, f.step));
    p = _mm256_blendv_ps(p, _mm256_mul_ps(p, t), _mm256_cmp_ps(kf, nn, _CMP_LT_OQ));
  }
  const __m256 head = _mm256_blendv_ps(_mm256_mul_ps(nn, la), la, f.small);
  const __m256 r = _mm256_add_ps(head, host_log8(p));
  // The cancelling terms: the caller's scalar path redoes them in float64.
  const __m256 cancels =
      _mm256_and_ps(_mm256_cmp_ps(nn, _mm256_set1_ps(2.0f), _CMP_GE_OQ), cancels8(la, r));
  _mm256_storeu_ps(term, _mm256_and_ps(exact, r));  // (0 in the lanes not exact)
  done = exact_bits & ~static_cast<unsigned>(_mm256_movemask_ps(cancels));
}

DM_AVX2 void shared_adpoch8_avx2(const float* a_in, const float* n_in, float* term,
                                 unsigned& nonzero, unsigned& done) {
  const __m256 n = _mm256_loadu_ps(n_in);
  const ExactLanes8 e = exact_lanes8(n_in, n);
  nonzero = e.nonzero;
  done = e.exact_bits;
  if (e.exact_bits == 0) {
    _mm256_storeu_ps(term, _mm256_setzero_ps());
    return;
  }
  const __m256 a = _mm256_loadu_ps(a_in);
  const __m256 one = _mm256_set1_ps(1.0f);
  const Factors8 f = exact_factors8(a);
  // adpoch_exact: P and Q over factors 1 .. n - 1 (the lanes past their
  // count keep theirs), then 1 + (small ? a : 1) Q / P.
  const __m256 nn = _mm256_and_ps(e.exact, n);
  __m256 p = one, q = _mm256_setzero_ps();
  for (int k = 1; k < e.top; ++k) {
    const __m256 kf = _mm256_set1_ps(static_cast<float>(k));
    const __m256 t = _mm256_add_ps(f.base, _mm256_mul_ps(kf, f.step));
    const __m256 use = _mm256_cmp_ps(kf, nn, _CMP_LT_OQ);
    q = _mm256_blendv_ps(q, _mm256_add_ps(_mm256_mul_ps(q, t), p), use);
    p = _mm256_blendv_ps(p, _mm256_mul_ps(p, t), use);
  }
  const __m256 scale = _mm256_blendv_ps(one, a, f.small);
  const __m256 r = _mm256_add_ps(one, _mm256_mul_ps(scale, _mm256_div_ps(q, p)));
  _mm256_storeu_ps(term, _mm256_and_ps(e.exact, r));  // (0 in the lanes not exact)
}

DM_AVX2 void shared_table8_avx2(const float* a_in, const float* la_in, int top, bool log_poch,
                                const float* log_fact, float (*entry)[8], uint8_t* redo) {
  const __m256 a = _mm256_loadu_ps(a_in);
  const __m256 la = _mm256_loadu_ps(la_in);
  const __m256 one = _mm256_set1_ps(1.0f);
  const Factors8 f = exact_factors8(a);
  const __m256 q_scale = _mm256_blendv_ps(one, a, f.small);  // adpoch: (small ? a : 1) Q / P
  __m256 p = one, q = _mm256_setzero_ps();  // ExactRun after factors 1 .. n - 1
  for (int n = 1; n <= top; ++n) {
    const __m256 nf = _mm256_set1_ps(static_cast<float>(n));
    if (log_poch) {
      // exact_run_lnpoch, lnpoch_exact_cancels, then - log n!
      const __m256 head = _mm256_blendv_ps(_mm256_mul_ps(nf, la), la, f.small);
      const __m256 r = _mm256_add_ps(head, host_log8(p));
      const __m256 cancels = n >= 2 ? cancels8(la, r) : _mm256_setzero_ps();
      redo[n] = static_cast<uint8_t>(_mm256_movemask_ps(cancels));
      _mm256_storeu_ps(entry[n], _mm256_sub_ps(r, _mm256_set1_ps(log_fact[n])));
    } else {
      // exact_run_value's adpoch
      redo[n] = 0;
      _mm256_storeu_ps(entry[n], _mm256_add_ps(one, _mm256_mul_ps(q_scale, _mm256_div_ps(q, p))));
    }
    // exact_run_step
    const __m256 t = _mm256_add_ps(f.base, _mm256_mul_ps(nf, f.step));
    q = _mm256_add_ps(_mm256_mul_ps(q, t), p);
    p = _mm256_mul_ps(p, t);
  }
}

DM_AVX2 void shared_alpha_avx2(const float* la, int64_t n, float* alpha,
                               ExactFactors<float>* factors) {
  int64_t v = 0;
  for (; v + 8 <= n; v += 8) {
    const __m256 x = _mm256_loadu_ps(la + v);
    const __m128 lo = host_exp4(_mm256_castps256_ps128(x));
    const __m128 hi = host_exp4(_mm256_extractf128_ps(x, 1));
    const __m256 a = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    const Factors8 f = exact_factors8(a);
    alignas(32) float base[8], step[8];
    _mm256_storeu_ps(alpha + v, a);
    _mm256_store_ps(base, f.base);
    _mm256_store_ps(step, f.step);
    const unsigned s = static_cast<unsigned>(_mm256_movemask_ps(f.small));
    for (int j = 0; j < 8; ++j) factors[v + j] = {base[j], step[j], (s >> j & 1) != 0};
  }
  for (; v < n; ++v) {
    alpha[v] = dm_exp(la[v]);
    factors[v] = exact_factors(alpha[v], 1.0f / alpha[v]);
  }
}

#else  // not x86-64 with GCC or Clang: the scalar path only

bool shared_rows_avx2_available() { return false; }

void shared_lnpoch8_avx2(const float*, const float*, const float*, float*, unsigned& nonzero,
                         unsigned& done) {
  nonzero = done = 0;
}

void shared_adpoch8_avx2(const float*, const float*, float*, unsigned& nonzero, unsigned& done) {
  nonzero = done = 0;
}

void shared_table8_avx2(const float*, const float*, int, bool, const float*, float (*)[8],
                        uint8_t*) {}

void shared_alpha_avx2(const float*, int64_t, float*, ExactFactors<float>*) {}

#endif

}  // namespace cpu
}  // namespace dirmult
