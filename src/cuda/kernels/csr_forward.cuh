// The CSR forwards, lanes striding over a row's nonzeros (batch-invariant: a
// row's sum order depends on its own nonzeros only): csr_forward_table_kernel
// (the one most calls take: small counts' lnpoch from a table, See Note [CSR
// tables]) and csr_forward_kernel (the per-nonzero math, alpha gathered
// through the read-only cache, for tables too large). See Note [CSR inputs].
#pragma once

#include "csr_alpha.cuh"

namespace dirmult {
namespace cuda {

constexpr int kCsrRowsPerBlock = 8;  // warps of 32 lanes, a row each

// out[b * K + k] = sum over row b's nonzeros of lnpoch(a_kc, n) [- log n!]
// - lnpoch(A_k, N_b) [+ log N_b!]; NaN for a bad count, a column outside
// [0, V), offsets outside the nonzeros, or a non-finite log_alpha of k.
template <typename T, typename value_t, typename index_t>
__global__ void __launch_bounds__(kCsrRowsPerBlock * 32)
    csr_forward_kernel(const index_t* __restrict__ crow, const index_t* __restrict__ col,
                       const value_t* __restrict__ val, int64_t B, int64_t nnz, int64_t V, int K,
                       const CsrColumn<T>* __restrict__ cols, const double* __restrict__ log_A,
                       bool normalize, T* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kCsrRowsPerBlock + (threadIdx.x >> 5);
  if (b >= B) return;  // (warp-uniform)
  int64_t j0, j1;
  bool ok = csr_row_range(crow, b, nnz, j0, j1);
  double N = 0.0;
  for (int k = 0; k < K; ++k) {
    double s = 0.0, lane_N = 0.0;
    bool lane_ok = true;
    for (int64_t j = j0 + lane; j < j1; j += 32) {
      const int64_t c = static_cast<int64_t>(__ldg(col + j));
      const value_t x = __ldg(val + j);
      const T n = static_cast<T>(x);
      if (c < 0 || c >= V || !is_valid_count(n)) {
        lane_ok = false;
        continue;
      }
      if (n == T(0)) continue;
      lane_N += static_cast<double>(x);
      const CsrColumn<T> cs = load_csr_column(cols + c * K + k);
      s += static_cast<double>(lnpoch(cs.factors(), cs.a, cs.log_a, n));
      if (normalize) s -= static_cast<double>(log_factorial(n));
    }
    if (k == 0) {
      N = warp_sum(lane_N);
      ok = __all_sync(0xffffffffu, lane_ok) && ok;
    }
    s = warp_sum(s);
    if (lane == 0) {
      const double lA = log_A[k];  // See Note [Log-space totals]
      double r = static_cast<double>(NAN);
      if (ok && lA == lA) {
        r = s - lnpoch<double>(exp(lA), lA, N);
        if (normalize) r += log_factorial<double>(N);
      }
      out[b * K + k] = static_cast<T>(r);
    }
  }
}

// Rows a warp takes in csr_forward_table_kernel: each row walked by the
// whole warp, then its finish by one lane (lane r for the warp's row r), so
// that for rows of few nonzeros the float64 finish runs on 32 lanes at once.
constexpr int kCsrRowsPerWarpShort = 32;
// Nonzeros a lane loads before it uses any, by components per walk: the
// loads' latencies overlap (their table entries take KW registers each).
template <int KW>
constexpr int csr_loads_in_flight() {
  return KW == 1 ? 4 : 2;
}
// With many components a walk gathers the U nonzeros' table entries before
// it uses any, so that their latencies overlap too; a single component's
// walk gathers each as it adds it and runs 4 blocks an SM instead in float32
// (64 registers), faster than the hoisted gathers at 3. Walks of 16 in
// float32 run 2 blocks an SM (128 registers, about 100 bytes spilled) rather
// than one at 168 registers (docs/PERFORMANCE_LEDGER.md, CSR counts).
template <int KW>
constexpr bool csr_hoists_gathers() {
  return KW > 1;
}
template <typename T, int KW>
constexpr int csr_forward_min_blocks() {
  return sizeof(T) == 4 ? (KW == 1 ? 4 : KW == 16 ? 2 : 1) : 1;
}

// Entries of T a 16-byte load holds.
template <typename T>
constexpr int csr_entries_per_load() {
  return 16 / static_cast<int>(sizeof(T));
}

// The table entries e[0 .. kn) of one (column, count) that a walk adds (out
// past kn: 0 or the table's zero padding): in 16-byte loads where `vec` (e
// 16-byte aligned, and whole loads within the table: csr_table_stride), so
// that a nonzero's 16 entries take 4 loads in float32 rather than 16.
template <typename T, int KW>
__device__ __forceinline__ void load_table_entries(const T* __restrict__ e, bool vec, int kn,
                                                   T out[KW]) {
  constexpr int L = csr_entries_per_load<T>();
  if constexpr (KW % L == 0) {
    if (vec) {
#pragma unroll
      for (int q = 0; q < KW / L; ++q) {
        if (q * L >= kn) {
#pragma unroll
          for (int i = 0; i < L; ++i) out[q * L + i] = T(0);
        } else if constexpr (sizeof(T) == 4) {
          const float4 x = __ldg(reinterpret_cast<const float4*>(e) + q);
          out[4 * q] = x.x, out[4 * q + 1] = x.y, out[4 * q + 2] = x.z, out[4 * q + 3] = x.w;
        } else {
          const double2 x = __ldg(reinterpret_cast<const double2*>(e) + q);
          out[2 * q] = x.x, out[2 * q + 1] = x.y;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int kk = 0; kk < KW; ++kk) out[kk] = kk < kn ? __ldg(e + kk) : T(0);
}

// lnpoch(a_kc, n) [- log n!] for a count off the table (a non-integer or
// one above kMaxExactCount; n > 0), in float64 as the sum takes it.
template <typename T>
__device__ __noinline__ double csr_rare_term(const CsrColumn<T>* __restrict__ cols, int64_t c,
                                             int K, int k, T n, bool normalize) {
  const CsrColumn<T> cs = load_csr_column(cols + c * K + k);
  double t = static_cast<double>(lnpoch_off_exact(cs.factors(), cs.a, cs.log_a, n));
  if (normalize) t -= static_cast<double>(log_factorial(n));
  return t;
}

// The same rows as csr_forward_kernel with the per-nonzero math replaced by
// the table (See Note [CSR tables]): a nonzero of count n <= kMaxExactCount
// adds tab[csr_table_index(c, n, Kt) + k] (minus log n! from a block copy).
// A warp takes R consecutive rows and components in walks of KW; each row's
// sums use the same order as csr_forward_kernel's (a lane's nonzeros in
// increasing order, then warp_sum), so a row depends on its own nonzeros
// only.
template <typename T, typename value_t, typename index_t, int R, int KW>
__global__ void __launch_bounds__(kCsrRowsPerBlock * 32, csr_forward_min_blocks<T, KW>())
    csr_forward_table_kernel(const index_t* __restrict__ crow, const index_t* __restrict__ col,
                             const value_t* __restrict__ val, int64_t B, int64_t nnz, int64_t V,
                             int K, int Kt, const T* __restrict__ tab,
                             const CsrColumn<T>* __restrict__ cols,
                             const double* __restrict__ log_A,
                             bool normalize, T* __restrict__ out) {
  __shared__ T log_fact[kTableWidth];
  if (threadIdx.x < kTableWidth) log_fact[threadIdx.x] = log_factorial(static_cast<T>(threadIdx.x));
  __syncthreads();
  constexpr int U = csr_loads_in_flight<KW>();
  const int lane = threadIdx.x & 31;
  const int64_t b0 =
      (static_cast<int64_t>(blockIdx.x) * kCsrRowsPerBlock + (threadIdx.x >> 5)) * R;
  if (b0 >= B) return;  // (warp-uniform)
  const int rows = static_cast<int>(min(static_cast<int64_t>(R), B - b0));
  for (int k0 = 0; k0 < K; k0 += KW) {
    const int kn = min(KW, K - k0);
    // Entry (c, n, k0) is Kt (c * 16 + n - 1) + k0 entries from tab.
    const bool vec = Kt % csr_entries_per_load<T>() == 0;
    double mine[KW];  // lane r: the sums of row b0 + r
    double mine_N = 0.0;
    bool mine_ok = false;
    for (int r = 0; r < rows; ++r) {
      int64_t j0, j1;
      bool ok = csr_row_range(crow, b0 + r, nnz, j0, j1);
      double s[KW];
#pragma unroll
      for (int kk = 0; kk < KW; ++kk) s[kk] = 0.0;
      double lane_N = 0.0;
      bool lane_ok = true;
      for (int64_t jb = j0 + lane; jb < j1; jb += 32 * U) {
        index_t cj[U];
        value_t xj[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t j = jb + 32 * u;
          cj[u] = j < j1 ? __ldg(col + j) : index_t(0);
          xj[u] = j < j1 ? __ldg(val + j) : value_t(0);
        }
        T tv[U][KW];
        if constexpr (csr_hoists_gathers<KW>()) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const T n = static_cast<T>(xj[u]);
            const bool table = cj[u] >= 0 && cj[u] < V && n > T(0) && is_exact_count(n);
            if (table) {
              load_table_entries<T, KW>(
                  tab + csr_table_index(cj[u], static_cast<int>(n), Kt) + k0, vec, kn, tv[u]);
            } else {
#pragma unroll
              for (int kk = 0; kk < KW; ++kk) tv[u][kk] = T(0);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t c = static_cast<int64_t>(cj[u]);
          const T n = static_cast<T>(xj[u]);
          if (c < 0 || c >= V || !is_valid_count(n)) {
            lane_ok = false;
            continue;
          }
          if (n == T(0)) continue;
          lane_N += static_cast<double>(xj[u]);
          if (is_exact_count(n)) {
            const double lf = static_cast<double>(log_fact[static_cast<int>(n)]);
            if constexpr (!csr_hoists_gathers<KW>()) {
              load_table_entries<T, KW>(tab + csr_table_index(c, static_cast<int>(n), Kt) + k0,
                                        vec, kn, tv[u]);
            }
#pragma unroll
            for (int kk = 0; kk < KW; ++kk) {
              if (kk < kn) {
                s[kk] += static_cast<double>(tv[u][kk]);
                if (normalize) s[kk] -= lf;
              }
            }
          } else {
#pragma unroll
            for (int kk = 0; kk < KW; ++kk) {  // (unrolled: s stays in registers)
              if (kk < kn) s[kk] += csr_rare_term(cols, c, K, k0 + kk, n, normalize);
            }
          }
        }
      }
      const double N = warp_sum(lane_N);
      ok = __all_sync(0xffffffffu, lane_ok) && ok;
#pragma unroll
      for (int kk = 0; kk < KW; ++kk) {
        if (kk < kn) {
          const double t = __shfl_sync(0xffffffffu, warp_sum(s[kk]), 0);
          if (lane == r % 32) mine[kk] = t;
        }
      }
      const double Nr = __shfl_sync(0xffffffffu, N, 0);
      if (lane == r % 32) mine_N = Nr, mine_ok = ok;
    }
    if (lane < rows) {
      const int64_t b = b0 + lane;
#pragma unroll
      for (int kk = 0; kk < KW; ++kk) {
        if (kk < kn) {
          const double lA = log_A[k0 + kk];
          double r = static_cast<double>(NAN);
          if (mine_ok && lA == lA) {
            r = mine[kk] - lnpoch<double>(exp(lA), lA, mine_N);
            if (normalize) r += log_factorial<double>(mine_N);
          }
          out[b * K + k0 + kk] = static_cast<T>(r);
        }
      }
    }
  }
}

}  // namespace cuda
}  // namespace dirmult
