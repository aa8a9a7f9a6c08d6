// Forward for per-sample float32 alpha ((B, V) log_alpha): every element
// has its own concentration, so no table can serve it and the kernel is
// bound by instruction issue, not bytes. It is written to a per-element
// budget (docs/PERFORMANCE_LEDGER.md, per-sample alpha):
//  * A: an accurate exp of every alpha (zero counts too), summed four at a
//    time in float before the float64 add (float64 conversions run at a
//    quarter of the FP32 rate on sm_90);
//  * the count classified by table_index (float adds, no F2I/I2F), N summed
//    as integers;
//  * the exact products of a lane's four counts in one loop to the warp's
//    largest count, two factors per step (a product, a sum and one
//    predicated multiply), and one log for the four products;
//  * cancellation (log a < 0 against log p: |lnpoch| < 1) recognised from
//    a p in (1/e, e) without a log per count. Those counts' float32 values
//    (one log of their a p's product per group of kGroup loads) are kept
//    where the row's magnitudes bound their error; else they are redone in
//    float64 after the group (redoing all of them was slower:
//    docs/PERFORMANCE_LEDGER.md);
//  * counts off the exact path, bad ones and the cancelling ones redone
//    are deferred: marked per lane, then every kGroup loads the warp's
//    marks are queued in shared memory and spread over its lanes.
// The rows are not the same bits as the scalar path's (the products are
// paired, the logs shared); the float64 comparisons in the tests bound them.
// forward_rows_per_sample_kernel (per_sample_forward.cuh) serves float64.
#pragma once

#include <cfloat>

#include <cuda_pipeline.h>

#include "per_sample_forward.cuh"
#include "per_sample_terms.cuh"
#include "rare_counts.cuh"
#include "row_chunks.cuh"
#include "table_lookup.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// The staging slots of a lane: its counts in 16-byte parts, then its four
// log_alpha, each part 32 lanes x 16 bytes after the one before, so that
// one 32-bit shared address serves them all (two arrays took ~10 more
// instructions a step to address).
template <typename count_t>
constexpr int kCountParts = sizeof(Count4<count_t>) <= 16 ? 1 : 2;
constexpr unsigned kPartBytes = 32 * 16;

// Starts the asynchronous copy (cp.async: the bytes land in shared memory
// without holding registers) of a lane's four counts and four log_alpha,
// aligned runs (`aligned` rows), to its slots at shared address dst.
template <typename count_t>
__device__ __forceinline__ void stage_step(unsigned dst, const count_t* __restrict__ c_src,
                                           const float* __restrict__ l_src) {
  constexpr int kBytes = 4 * sizeof(count_t);
  static_assert(kBytes == 4 || kBytes == 16 || kBytes == 32, "a count type of 1, 4 or 8 bytes");
  if constexpr (kBytes == 4) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(c_src) : "memory");
  } else {
#pragma unroll
    for (int h = 0; h < kBytes / 16; ++h) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + kPartBytes * h),
                   "l"(reinterpret_cast<const char*>(c_src) + 16 * h)
                   : "memory");
    }
  }
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
               ::"r"(dst + kPartBytes * kCountParts<count_t>), "l"(l_src)
               : "memory");
}

// Four blocks per SM (64 registers). Unbounded, the normalize variants take
// 77-79 registers (three blocks) and float64 counts 74; the fourth block
// pays for the stack: 8 bytes for float32 counts, 16 for uint8, 24 for
// float64, 32 for the normalize variants (faster either way, the same bits:
// docs/PERFORMANCE_LEDGER.md).
template <typename count_t, bool normalize>
__global__ void __launch_bounds__(kRowWarps * 32, 4)
    forward_per_sample_float_kernel(const count_t* __restrict__ counts,
                                    const float* __restrict__ log_alpha, int64_t B, int64_t V,
                                    RowSplit split, bool aligned,
                                    float* __restrict__ out, RowPartial* __restrict__ partial) {
  constexpr int kGroup = 8;  // loads per deferral group: 4 * kGroup mark bits
  __shared__ float log_fact[kTableWidth];  // log n!, n = 0 .. kMaxExactCount
  // Each warp's deferred counts of a group, as column offsets from the
  // group's first column, in (lane, bit) order.
  __shared__ uint16_t queue[kRowWarps][32 * 4 * kGroup];
  // Each warp's next whole step is staged in shared memory (double-buffered,
  // cp.async), so that its loads are in flight while the warp computes the
  // current one (docs/PERFORMANCE_LEDGER.md).
  __shared__ float4 stage[kRowWarps][2][kCountParts<count_t> + 1][32];
  if (normalize && threadIdx.x < kTableWidth) {
    log_fact[threadIdx.x] = log_factorial(static_cast<float>(threadIdx.x));
  }
  __syncthreads();
  const RowItem it = row_item(split, B, V);
  // (The lane is read from threadIdx.x where used: a lane register held
  // through the loop pushed A's float64 sum into a stack slot per load. A
  // warp past the last item runs no loads: the block finishes together.)
  const int64_t v_begin = it.v_begin, v_end = it.valid ? it.v_end : it.v_begin;
  const count_t* row = counts + it.b * V;
  const float* lrow = log_alpha + it.b * V;

  double acc = 0.0, N = 0.0, norm = 0.0, A = 0.0;
  int table_N = 0;  // this group's table counts (flushed into N per group)
  bool ok = true;
  unsigned slow = 0;    // counts off the exact path or bad: bit 4 (load % kGroup) + j
  unsigned cancel = 0;  // cancelling counts, the same bits
  // The cancelling counts' float32 values: the log of the product of their
  // a p (each in (0.35, 2.9), so 32 of them stay finite).
  float cancel_prod = 1.0f;
  int group_m = 0;  // the group's largest exact-path count
  float kept_err = 0.0f;  // the kept cancelling values' error bound, in units of 2^-24
  float magnitude = 0.0f;  // sum of |the loads' float32 sums|: at most the terms' magnitudes
  // The warp's steps read through pointers to the lane's columns, stepped
  // by 128, and the columns left; a row piece's first column, last column
  // and row are not held through the loop (recomputing the addresses from
  // them took ~30 instructions a step, and holding them all pushed the
  // loop past 64 registers).
  const count_t* c_at_v = row + v_begin + 4 * (threadIdx.x & 31);
  const float* l_at_v = lrow + v_begin + 4 * (threadIdx.x & 31);
  int64_t left = v_end - v_begin;  // the warp's columns from this step's first
  // Each lane copies and reads only its own slots, so the warp needs no
  // barrier.
  const int stage_warp = threadIdx.x >> 5;
  const unsigned stage_at = static_cast<unsigned>(
      __cvta_generic_to_shared(&stage[stage_warp][0][0][threadIdx.x & 31]));
  constexpr unsigned kBuf = sizeof(stage[0][0]);
  if (aligned && left >= 128) stage_step(stage_at, c_at_v, l_at_v);
  __pipeline_commit();
  // Warp-uniform steps (the warp reductions inside): lanes past the end read
  // zeros, which take no term and add nothing to A.
  for (int load = 0; left > 0; ++load, left -= 128, c_at_v += 128, l_at_v += 128) {
    float n[4], la[4];
    // A whole step (all but a row piece's last, in aligned rows) needs no
    // bounds per lane.
    const bool whole = aligned && left >= 128;
    if (aligned && left >= 256) {
      // (The buffer it fills was read by this lane in the step before.)
      const unsigned next = (load + 1) & 1;
      stage_step(stage_at + next * kBuf, c_at_v + 128, l_at_v + 128);
    }
    __pipeline_commit();  // one group per step, empty or not
    if (whole) {
      __pipeline_wait_prior(1);  // this step's group
      const float4* slot = &stage[stage_warp][load & 1][0][threadIdx.x & 31];
      if constexpr (sizeof(count_t) == 8) {
        const double2 c01 = *reinterpret_cast<const double2*>(slot);
        const double2 c23 = *reinterpret_cast<const double2*>(slot + 32);
        n[0] = static_cast<float>(c01.x), n[1] = static_cast<float>(c01.y);
        n[2] = static_cast<float>(c23.x), n[3] = static_cast<float>(c23.y);
      } else {
        const Count4<count_t> c = *reinterpret_cast<const Count4<count_t>*>(slot);
#pragma unroll
        for (int j = 0; j < 4; ++j) n[j] = static_cast<float>(c.v[j]);
      }
      const float4 l = slot[32 * kCountParts<count_t>];
      la[0] = l.x, la[1] = l.y, la[2] = l.z, la[3] = l.w;
    } else {
      // Past the end a zero count of concentration exp(-200), which is 0 in
      // float: such a column adds nothing to A or to the sums, so the step
      // needs no per-count bounds below. Scalar loads (aligned = false): the
      // vector path, once per row piece, cost the float64-count variants
      // 8 more bytes of stack.
      load_lane_counts(c_at_v, l_at_v, lane_columns(left, threadIdx.x & 31), false, -200.0f, n,
                       la);
    }
    PerSampleTerm t[4];
    float a[4], asum = 0.0f, nf = 0.0f;
    int mi[4], m_max = 0;
    unsigned nib = 0;  // this load's counts off the exact path
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j] = dm_exp(la[j]);
      asum += a[j];
      ok = ok && fabsf(la[j]) <= FLT_MAX;
      const bool hit = table_index(n[j], mi[j]);
      mi[j] = hit ? mi[j] : 0;
      nib |= hit ? 0u : 1u << j;
      table_N += mi[j];
      m_max = max(m_max, mi[j]);
      if (normalize) nf += log_fact[mi[j]];
      t[j] = per_sample_term(a[j], la[j], hit ? n[j] : 0.0f);
      // An even m leaves factor k = m - 1 out of the pairs below: it starts
      // the product (here the term's fields are still in registers; after
      // the loop they were recomputed, 8.5 instructions a count).
      const bool odd_top = (0x15554u & (1u << mi[j])) != 0u;  // m = 2, 4, ..., 16
      t[j].p = odd_top ? t[j].base + (t[j].m - 1.0f) * t[j].step : 1.0f;
    }
    A += static_cast<double>(asum);
    if (normalize) norm -= static_cast<double>(nf);
    m_max = __reduce_max_sync(0xffffffffu, m_max);
    if (m_max >= 3) {
      // Factors k = 1 .. m - 1 two at a time, (k, k + 1) for k = 1, 3, ...
      // (two factors for a product, a sum and a predicated multiply); an
      // even m's last one (k = m - 1) is already in p.
      // (kf alone counts the steps: an int index beside it cost two more
      // instructions a step.)
      const float last = static_cast<float>(m_max);
#pragma unroll 1
      for (float kf = 1.0f; kf + 1.0f < last; kf += 2.0f) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float f = t[j].base + kf * t[j].step;
          const float pair = f * (f + t[j].step);
          if (kf + 1.0f < t[j].m) t[j].p *= pair;
        }
      }
    }
    float lsum = 0.0f;
    unsigned cnib = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float ap = a[j] * t[j].p;
      if (per_sample_cancels(la[j], ap, t[j])) {
        cnib |= 1u << j;
        cancel_prod *= ap;
        t[j].p = 1.0f, t[j].lbase = 0.0f;
      }
      lsum += t[j].lbase;
    }
    group_m = max(group_m, m_max);
    slow |= nib << (4 * (load % kGroup));
    cancel |= cnib << (4 * (load % kGroup));
    float logs = 0.0f;  // every p is 1 when no count is 2 or more
    if (m_max >= 2) {
      // One log for the four products: each p < 2^60 (at most 15 factors
      // below 24, or below 3 scaled), so p01 and p23 are finite; their
      // product overflows only for large counts.
      const float p01 = t[0].p * t[1].p, p23 = t[2].p * t[3].p, p = p01 * p23;
      logs = p <= FLT_MAX ? dm_log_normal(p) : dm_log_normal(p01) + dm_log_normal(p23);
    }
    acc += static_cast<double>(lsum + logs);
    magnitude += fabsf(lsum + logs);
    if (load % kGroup == kGroup - 1 || left <= 128) {
      N += static_cast<double>(table_N);
      table_N = 0;
      // The cancelling counts keep their float32 values where the error
      // those can carry (with the earlier groups' kept ones) is at most
      // 2^-22 of the row's magnitudes so far, the measure the row's accuracy
      // is stated in (tests/reference.py magnitudes): for long rows of
      // moderate terms nearly always. Else (rows of few or small terms)
      // they are redone in float64 from log a, keeping their own relative
      // accuracy. Error bound of a kept value, units of 2^-24 of 1: a from
      // expf (2 ulp) also in every factor (a H(m - 1) times), 5 per factor
      // pair, a p and the group's product, the log of a product near 1:
      // under 3 m + 20.
      const int cancels = static_cast<int>(
          __reduce_add_sync(0xffffffffu, static_cast<unsigned>(__popc(cancel))));
      if (cancels != 0) {
        const float group_err = static_cast<float>(cancels * (3 * group_m + 20));
        if (kept_err + group_err <= kKeptCancelErrorBudget * warp_allsum(magnitude)) {
          kept_err += group_err;
          acc += static_cast<double>(dm_log_normal(cancel_prod));
        } else {
          slow |= cancel;
        }
      }
      cancel = 0, cancel_prod = 1.0f, group_m = 0;
      // The counts left (off the exact path, bad, cancelling and redone):
      // queued in shared memory, then spread over the warp's lanes (a lane's
      // own would keep the warp for as many rounds as the lane with the
      // most; spread_marks, which hands each value back to its lane, was
      // slower here: docs/PERFORMANCE_LEDGER.md).
      if (__any_sync(0xffffffffu, slow != 0)) {
        const int lane = threadIdx.x & 31;
        // The group's first column, as offsets from the lane's pointers.
        const int64_t group_v = -4 * lane - 128 * (load % kGroup);
        auto take = [&](int64_t vv) {
          const float l = __ldg(l_at_v + vv);
          int m;
          const count_t c = __ldg(c_at_v + vv);
          if (table_index(static_cast<float>(c), m)) {
            // cancelling and redone: the float64 value (N and log n! taken)
            acc += lnpoch_exact_refined(static_cast<double>(l), m);
            return;
          }
          add_rare_term(rare_term(c, normalize,
                                  [&](float x) { return lnpoch(dm_exp(l), l, x); }),
                        normalize, acc, N, norm, ok);
        };
        const int mine = __popc(slow);
        const int end = warp_inclusive_scan(mine, lane);
        const int total = __shfl_sync(0xffffffffu, end, 31);
        uint16_t* q = queue[threadIdx.x >> 5];
        const int group_off = 4 * lane;
#pragma unroll 1
        for (int i = end - mine; slow != 0; ++i) {
          const int e = __ffs(static_cast<int>(slow)) - 1;
          slow &= slow - 1;
          q[i] = static_cast<uint16_t>(group_off + 128 * (e >> 2) + (e & 3));
        }
        __syncwarp();
#pragma unroll 1
        for (int i = lane; i < total; i += 32) take(group_v + q[i]);
        __syncwarp();  // the queue is reused by the next group
      }
    }
  }
  write_per_sample_rows(split, B, acc, N, norm, A, ok, normalize, log_alpha, V, out, partial);
}

}  // namespace cuda
}  // namespace dirmult
