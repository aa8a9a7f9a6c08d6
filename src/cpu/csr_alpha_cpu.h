// The CPU CSR kernels' shared state: each (column, component)'s alpha and
// exact-path factors, the totals A_k, the forward's table (See Note [CSR
// tables]) and the row helpers. Used by log_lik_csr_cpu.cpp and
// log_lik_csr_with_grad_cpu.cpp.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "policy_cpu.h"
#include "dirmult/math.h"

namespace dirmult {
namespace cpu {
namespace csr {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Columns per block of the concentration totals: fixed, so that A_k is the
// same bits for any thread count.
constexpr int64_t kCsrAlphaBlock = 4096;
// Rows per block of the backward's row terms (fixed, as above).
constexpr int64_t kCsrRowBlock = 4096;

template <typename T>
struct CsrColumn {
  T a, log_a;
  ExactFactors<T> f;
};

// exp(log_alpha) and the exact-path factors of every (column, component),
// laid out (V, K) so that a nonzero's K components are adjacent, and the
// totals A_k with whether component k's log_alpha is all finite.
template <typename T>
struct CsrAlpha {
  int64_t V, K;
  std::vector<CsrColumn<T>> cols;
  std::vector<double> A;
  std::vector<LogTotal> log_A;  // A_k with log A_k (See math.h, LogTotal)
  std::vector<char> finite;
  // lnpoch(a_kc, n), n = 1 .. kMaxExactCount, laid out (V, n, K); empty
  // unless fill_table ran (See Note [CSR tables]).
  std::vector<T> table;

  const T* entries(int64_t c, int n) const {
    return table.data() + (c * kMaxExactCount + (n - 1)) * K;
  }

  // The forward's table: the exact path's running products, a cancelling
  // entry recomputed in float64 (lnpoch_exact_checked's values).
  void fill_table() {
    table.resize(static_cast<size_t>(V * K * kMaxExactCount));
    torch::stable::parallel_for(0, V, parallel_grain(K * kMaxExactCount * 8, 64),
                                [&](int64_t v0, int64_t v1) {
      for (int64_t v = v0; v < v1; ++v) {
        for (int64_t k = 0; k < K; ++k) {
          const CsrColumn<T>& cs = cols[v * K + k];
          ExactRun<T> run;  // after factors 1 .. n - 1 for entry n
          for (int n = 1; n <= kMaxExactCount; ++n) {
            T r = exact_run_lnpoch(run, cs.f, cs.log_a, n);
            if (lnpoch_exact_cancels(cs.log_a, n, r)) {
              r = static_cast<T>(lnpoch_exact_refined(static_cast<double>(cs.log_a), n));
            }
            table[(v * kMaxExactCount + (n - 1)) * K + k] = r;
            exact_run_step(cs.f, n, run);
          }
        }
      }
    });
  }

  CsrAlpha(const T* la, int64_t K_, int64_t V_) : V(V_), K(K_), cols(V_ * K_), A(K_, 0.0),
                                                  finite(K_, 1) {
    const int64_t blocks = (V + kCsrAlphaBlock - 1) / kCsrAlphaBlock;
    std::vector<double> part(blocks * K, 0.0);
    std::vector<char> part_finite(blocks * K, 1);
    torch::stable::parallel_for(0, blocks, parallel_grain(kCsrAlphaBlock * K), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t v0 = b * kCsrAlphaBlock, v1 = std::min(V, v0 + kCsrAlphaBlock);
        for (int64_t k = 0; k < K; ++k) {
          double s = 0.0;
          bool fin = true;
          for (int64_t v = v0; v < v1; ++v) {
            const T l = la[k * V + v];
            const T a = dm_exp(l);
            cols[v * K + k] = {a, l, exact_factors(a)};
            s += static_cast<double>(a);
            fin = fin && is_finite(l);
          }
          part[b * K + k] = s;
          part_finite[b * K + k] = fin;
        }
      }
    });
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t k = 0; k < K; ++k) {
        A[k] += part[b * K + k];
        finite[k] = finite[k] && part_finite[b * K + k];
      }
    }
    log_A.resize(K);
    for (int64_t k = 0; k < K; ++k) {
      log_A[k] = make_log_total<T>(A[k], [&] { return log_sum_exp(la + k * V, V); });
      A[k] = log_A[k].A;
    }
  }
};

// adpoch(a, n), n = 1 .. kMaxExactCount, of one (column, component) into
// dst[(n - 1) * stride]: adpoch_exact's values (the same products).
template <typename T>
inline void adpoch_entries(const CsrColumn<T>& cs, T* dst, int64_t stride) {
  ExactRun<T> run;  // after factors 1 .. n - 1 for entry n
  for (int n = 1; n <= kMaxExactCount; ++n) {
    dst[(n - 1) * stride] = exact_run_value(run, cs.f, cs.a, cs.log_a, n, false, false);
    exact_run_step(cs.f, n, run);
  }
}

// -lnpoch(A, N) [+ log N! when normalized]: the dense kernels' row term.
inline double csr_row_term(const LogTotal& A, double N, bool normalize) {
  double t = -lnpoch<double>(A.A, A.log_A, N);
  if (normalize) t += log_factorial<double>(N);
  return t;
}

// Row b's nonzeros [j0, j1), or false when its offsets are not a range of
// the nonzeros (then the row is NaN and nothing is read).
template <typename index_t>
inline bool row_range(const index_t* crow, int64_t b, int64_t nnz, int64_t& j0, int64_t& j1) {
  j0 = static_cast<int64_t>(crow[b]);
  j1 = static_cast<int64_t>(crow[b + 1]);
  return 0 <= j0 && j0 <= j1 && j1 <= nnz;
}

}  // namespace csr
}  // namespace cpu
}  // namespace dirmult
