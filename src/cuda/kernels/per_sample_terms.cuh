// The per-sample float32 kernels' exact-path terms: four counts' products
// in one loop to the warp's largest count.
#pragma once

#include "dirmult/math.h"

namespace dirmult {
namespace cuda {

// The exact-path state of one count: lnpoch(a, m) = lbase + log p once the
// factors base + k step, k = 1 .. m - 1, are multiplied into p.
struct PerSampleTerm {
  float base, step, lbase, m, p;
};

// 1 / x by the hardware approximation, within an ulp (IEEE division
// branches to a slow path for special operands, a branch per count in these
// kernels). Enough for a step r of factors 1 + k r: it moves their rounding
// by under an ulp.
__device__ __forceinline__ float approx_reciprocal(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The same with one Newton step, for a ratio that is a result.
__device__ __forceinline__ float newton_reciprocal(float x) {
  const float r = approx_reciprocal(x);
  return fmaf(r, fmaf(-x, r, 1.0f), r);
}

// Count n (m = n when table_index hit, else 0: the term is taken later or
// is 0) of concentration a = exp(la).
__device__ __forceinline__ PerSampleTerm per_sample_term(float a, float la, float m) {
  const bool small = a < Tuning<float>::kStirlingMin;
  const float r = approx_reciprocal(a);
  // lbase: log a (small a, m >= 1) or m log a; m = 0 gives 0 log a, which is
  // 0 wherever la is finite (a non-finite la makes the row NaN anyway).
  return {small ? a : 1.0f, small ? 1.0f : r, (small ? fminf(m, 1.0f) : m) * la, m, 1.0f};
}

// Whether lnpoch = la + log p (la = log a, ap = a p) cancels: |lnpoch| < 1,
// i.e. a p in (1/e, e), widened a little so that every count the float32
// difference would lose digits on is caught (math.h lnpoch_exact_cancels).
__device__ __forceinline__ bool per_sample_cancels(float la, float ap, const PerSampleTerm& t) {
  return la < 0.0f && t.m >= 2.0f && ap > 0.35f && ap < 2.9f;
}

}  // namespace cuda
}  // namespace dirmult
