// Backward for per-sample float32 alpha without a counts gradient (the DM
// regression case): grad_la[b, v] = g_b (adpoch(a, n) - a dpoch(A_b, N_b)),
// elementwise once the row totals are known. row_totals_kernel and
// elementwise_backward_kernel (elementwise_backward.cuh) do the same a count
// per thread with a 64-bit division per element for its row; these take a
// warp per (row, chunk) and four counts per lane at a time, as
// forward_per_sample_float_kernel does, with the exact-path products of the
// four counts in one loop to the warp's largest count.
#pragma once

#include <cfloat>

#include "elementwise_backward.cuh"
#include "per_sample_terms.cuh"
#include "row_chunks.cuh"
#include "spread_marks.cuh"
#include "table_lookup.cuh"
#include "vector_loads.cuh"
#include "warp_reduce.cuh"

namespace dirmult {
namespace cuda {

// The calling warp's sums over columns [v_begin, v_end) of row b: N and A
// (float64, the same sums as row_totals_kernel's in another order) and
// whether the counts and concentrations are valid, in every lane.
// Warp-uniform calls only.
struct PerSampleSums {
  double N, A;
  bool ok;
};

template <typename count_t>
__device__ __forceinline__ PerSampleSums per_sample_warp_sums(const count_t* __restrict__ row,
                                                              const float* __restrict__ lrow,
                                                              int64_t v_begin, int64_t v_end,
                                                              bool aligned) {
  const int lane = threadIdx.x & 31;
  double N = 0.0, A = 0.0;
  int table_N = 0;  // at most 16 per count; flushed into N every 1024 loads
  bool ok = true;
  int load = 0;
  // Pointers to the lane's columns stepped by 128, and the lane's columns
  // left (as forward_per_sample_float_kernel: no 64-bit address and bounds
  // arithmetic per step).
  const count_t* c = row + v_begin + 4 * lane;
  const float* l = lrow + v_begin + 4 * lane;
  for (int64_t left = v_end - v_begin - 4 * lane; left > 0;
       left -= 128, c += 128, l += 128, ++load) {
    const int in = left >= 4 ? 4 : static_cast<int>(left);
    float n[4], la[4];
    load_lane_counts(c, l, in, aligned, 0.0f, n, la);
    float asum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      asum += j < in ? dm_exp(la[j]) : 0.0f;
      ok = ok && fabsf(la[j]) <= FLT_MAX;
      int idx;
      if (table_index(n[j], idx)) {
        table_N += idx;
      } else {  // off the table: rare
        ok = ok && is_valid_count(n[j]);
        N += static_cast<double>(c[j]);
      }
    }
    A += static_cast<double>(asum);
    if ((load & 1023) == 1023) N += static_cast<double>(table_N), table_N = 0;
  }
  N += static_cast<double>(table_N);
  return {warp_allsum(N), warp_allsum(A), __all_sync(0xffffffffu, ok) != 0};
}

// Rows split into chunks: a warp per (row, chunk) sums its piece (the
// grid of per_sample_grad_kernel), and each gradient warp adds its row's
// pieces in order (per_sample_split_totals). A warp per row left few rows
// on few SMs (docs/PERFORMANCE_LEDGER.md, per-sample alpha).
template <typename count_t>
__global__ void __launch_bounds__(kRowWarps * 32)
    per_sample_chunk_sums_kernel(const count_t* __restrict__ counts,
                                 const float* __restrict__ log_alpha, int64_t B, int64_t V,
                                 RowSplit split, bool aligned, PerSampleSums* __restrict__ sums) {
  const RowItem it = row_item(split, B, V);
  if (!it.valid) return;
  const PerSampleSums s = per_sample_warp_sums(counts + it.b * V, log_alpha + it.b * V,
                                               it.v_begin, it.v_end, aligned);
  if ((threadIdx.x & 31) == 0) sums[it.b * split.num_chunks + it.c] = s;
}

// Row b's RowTotals from its chunks' sums (lanes over the chunks, then
// warp_allsum: a fixed order), valid in every lane; lrow: the row's
// log_alpha (V,). Warp-uniform call.
__device__ __forceinline__ RowTotals per_sample_split_totals(const PerSampleSums* __restrict__ sums,
                                                             int64_t b, int64_t num_chunks,
                                                             const float* __restrict__ lrow,
                                                             int64_t V, bool normalize) {
  double N = 0.0, A = 0.0;
  bool ok = true;
  for (int64_t c = threadIdx.x & 31; c < num_chunks; c += 32) {
    const PerSampleSums s = sums[b * num_chunks + c];
    N += s.N, A += s.A, ok = ok && s.ok;
  }
  return row_totals<float>(warp_allsum(N), row_log_total(warp_allsum(A), lrow, V),
                           __all_sync(0xffffffffu, ok), normalize);
}

// The gradient of columns [v_begin, v_end) of a row whose total is out of
// range (See Note [Log-space totals]): column factors a_v / A from log A,
// d = adpoch(A, N), a column per lane on the math path. Out of line, so
// the common rows' loop keeps its registers.
template <typename count_t>
__device__ __noinline__ void per_sample_grad_scaled(double g, const count_t* __restrict__ row,
                                                    const float* __restrict__ lrow,
                                                    int64_t v_begin, int64_t v_end, double d,
                                                    double log_A, float* __restrict__ out) {
  for (int64_t v = v_begin + (threadIdx.x & 31); v < v_end; v += 32) {
    const float la = lrow[v];
    const double adp = static_cast<double>(adpoch(dm_exp(la), static_cast<float>(row[v])));
    const double f = exp(static_cast<double>(la) - log_A);
    // (See Note [Zero-weight rows])
    out[v] = g == 0.0 ? 0.0f : static_cast<float>(g * (adp - f * d));
  }
}

// sums: per (row, chunk) (split rows, per_sample_chunk_sums_kernel), or
// nullptr where every row is one chunk: then the warp sums its row's totals
// first, and the gradient pass reads the row again from the caches (tall:
// the separate kernel read the counts and log_alpha from DRAM a second time).
template <typename count_t>
__global__ void __launch_bounds__(kRowWarps * 32)
    per_sample_grad_kernel(const float* __restrict__ grad, const count_t* __restrict__ counts,
                           const float* __restrict__ log_alpha,
                           const PerSampleSums* __restrict__ sums, int64_t B, int64_t V,
                           RowSplit split, bool aligned, bool normalize,
                           float* __restrict__ grad_la) {
  const int lane = threadIdx.x & 31;
  const RowItem it = row_item(split, B, V);
  if (!it.valid) return;
  const double g = static_cast<double>(grad[it.b]);
  const int64_t v_end = it.v_end;
  const count_t* row = counts + it.b * V;
  const float* lrow = log_alpha + it.b * V;
  RowTotals rt;
  if (sums != nullptr) {
    rt = per_sample_split_totals(sums, it.b, split.num_chunks, lrow, V, normalize);
  } else {
    const PerSampleSums s = per_sample_warp_sums(row, lrow, 0, V, aligned);
    rt = row_totals<float>(s.N, row_log_total(s.A, lrow, V), s.ok, normalize);
  }
  const double d = rt.d;
  if (rt.log_A == rt.log_A) {  // A out of range: warp-uniform, rare
    per_sample_grad_scaled(g, row, lrow, it.v_begin, v_end, d, rt.log_A, grad_la + it.b * V);
    return;
  }
  // Warp-uniform steps (the warp reduction inside); lanes past the end
  // compute on zeros and store nothing. Pointers to the lane's columns,
  // stepped by 128, and the warp's columns left.
  const count_t* c = row + it.v_begin + 4 * lane;
  const float* l = lrow + it.v_begin + 4 * lane;
  float* out = grad_la + it.b * V + it.v_begin + 4 * lane;
  for (int64_t left = v_end - it.v_begin; left > 0;
       left -= 128, c += 128, l += 128, out += 128) {
    const int in = lane_columns(left, lane);
    float n[4], la[4];
    load_lane_counts(c, l, in, aligned, 0.0f, n, la);
    float a[4], q[4];
    PerSampleTerm t[4];
    int mi[4], m_max = 0;
    bool hit[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j] = dm_exp(la[j]);
      hit[j] = table_index(n[j], mi[j]);
      mi[j] = hit[j] ? mi[j] : 0;
      m_max = max(m_max, mi[j]);
      t[j] = per_sample_term(a[j], la[j], static_cast<float>(mi[j]));
      q[j] = 0.0f;
    }
    m_max = __reduce_max_sync(0xffffffffu, m_max);
    // adpoch_exact's running products: p = prod f_k, q = dp, k < m.
    float kf = 1.0f;
#pragma unroll 1
    for (int k = 1; k < m_max; ++k, kf += 1.0f) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float f = t[j].base + kf * t[j].step;
        if (kf < t[j].m) {
          q[j] = q[j] * f + t[j].p;
          t[j].p *= f;
        }
      }
    }
    float adp[4];
    unsigned rare = 0;  // bit j: count j off the table (non-integer, large or bad)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // adpoch_exact: 1 + (a or 1) q / p.
      const float scale = a[j] < Tuning<float>::kStirlingMin ? a[j] : 1.0f;
      adp[j] = mi[j] == 0 ? 0.0f : fmaf(scale, q[j] * newton_reciprocal(t[j].p), 1.0f);
      rare |= hit[j] ? 0u : 1u << j;
    }
    // The rare counts' adpoch spread over the warp's lanes (spread_marks;
    // each lane taking its own kept the warp for up to four math paths a
    // step), from the owner's count and log_alpha (the same a and n).
    if (__any_sync(0xffffffffu, rare != 0)) {
      auto compute = [&](int owner, int e) {
        const int o = 4 * (owner - lane) + e;  // the owner's column, from this lane's
        return adpoch(dm_exp(__ldg(l + o)), static_cast<float>(__ldg(c + o)));
      };
      auto consume = [&](int e, float value) {
#pragma unroll
        for (int j = 0; j < 4; ++j) adp[j] = j == e ? value : adp[j];
      };
      spread_marks<float>(rare, compute, consume);
    }
    float gl[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // (g == 0: the row adds nothing, even with bad counts; See Note [Zero-weight rows])
      gl[j] = g == 0.0 ? 0.0f
                       : static_cast<float>(g * (static_cast<double>(adp[j]) -
                                                 static_cast<double>(a[j]) * d));
    }
    if (aligned && in == 4) {
      *reinterpret_cast<float4*>(out) = make_float4(gl[0], gl[1], gl[2], gl[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < in) out[j] = gl[j];
      }
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
