// dirmult::log_lik on CPU: the shared-alpha rows by lnp_row_sums (from the
// table or the math path, row_sums_cpu.h), the per-sample rows by the
// scalar path or, float32 with AVX2, by per_sample_avx2's blocks.
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../common/op_args.h"
#include "dirmult/math.h"
#include "log_lik_cpu.h"
#include "ops_cpu.h"
#include "per_sample_avx2.h"
#include "per_sample_rows_cpu.h"
#include "row_sums_cpu.h"
#include "tables_cpu.h"

namespace dirmult {
namespace cpu {

template <typename scalar_t, typename count_t>
void forward_shared(const count_t* counts, const scalar_t* la, int64_t B, int64_t V,
                    bool normalize, const TablePlan& plan, scalar_t* out, int64_t stride) {
  const SharedAlpha<scalar_t> sa(la, V);
  const std::vector<scalar_t> table = lnp_table(sa, plan, normalize);
  auto part = [&](int64_t b, int64_t v0, int64_t v1) {
    return lnp_row_sums<scalar_t, count_t>(counts + b * V, v0, v1, table, sa, normalize);
  };
  for_each_row(B, V, part, [&](int64_t b, const RowSums& r) {
    const bool ok = r.ok && sa.finite;
    out[b * stride] = static_cast<scalar_t>(ok ? r.s + row_term(sa.log_total, r.N, normalize) : kNaN);
  });
}

#define DM_INSTANTIATE_FORWARD(count_t)                                                      \
  template void forward_shared<float, count_t>(const count_t*, const float*, int64_t, int64_t, \
                                               bool, const TablePlan&, float*, int64_t);     \
  template void forward_shared<double, count_t>(const count_t*, const double*, int64_t,       \
                                                int64_t, bool, const TablePlan&, double*,     \
                                                int64_t);
DM_FOR_EACH_COUNT_TYPE(DM_INSTANTIATE_FORWARD)
#undef DM_INSTANTIATE_FORWARD

namespace {

// out[b] = log_lik(counts[b], la or la[b]) for each row b of counts (B, V).
template <typename scalar_t, typename count_t>
void forward_rows(const count_t* counts, const scalar_t* la, bool shared,
                  int64_t B, int64_t V, bool normalize, scalar_t* out) {
  if (shared) {
    forward_shared<scalar_t, count_t>(counts, la, B, V, normalize,
                                      forward_plan<scalar_t, count_t>(counts, B, V), out, 1);
    return;
  }
  auto part = [&](int64_t b, int64_t v0, int64_t v1) {
    const count_t* row = counts + b * V;
    const scalar_t* lrow = la + b * V;
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (cpu::per_sample_avx2_available()) {
        return per_sample_sums_avx2<count_t>(row, lrow, v0, v1, normalize);
      }
    }
    RowSums r;
    for (int64_t v = v0; v < v1; ++v) {
      const scalar_t a = dm_exp(lrow[v]);
      r.ok = r.ok && is_finite(lrow[v]);
      r.A += static_cast<double>(a);
      const scalar_t n = static_cast<scalar_t>(row[v]);
      if (n == scalar_t(0)) continue;
      if (!is_valid_count(n)) {  // the row is NaN; no term for it
        r.ok = false;
        continue;
      }
      r.N += static_cast<double>(row[v]);
      if (count_rounds<scalar_t>(row[v])) {
        r.s += count_term_f64(lrow[v], row[v], normalize);
        continue;
      }
      r.s += lnpoch(a, lrow[v], n);
      if (normalize) r.s -= log_factorial(n);
    }
    return r;
  };
  for_each_row(B, V, part, [&](int64_t b, const RowSums& r) {
    out[b] = static_cast<scalar_t>(
        r.ok ? r.s + row_term(row_log_total(r.A, la + b * V, V), r.N, normalize) : kNaN);
  });
}

}  // namespace

Tensor log_lik_cpu(Tensor counts, Tensor log_alpha, bool normalize) {
  const LogLikArgs<CpuDevice> a(counts, log_alpha);
  // V = 0: every row is empty, log-likelihood 0 (B counts no such rows).
  if (a.empty()) return torch::stable::new_zeros(a.log_alpha, batch_shape(a.counts));
  Tensor out = torch::stable::new_empty(a.log_alpha, batch_shape(a.counts));  // every row written
  a.dispatch([&](auto t) {
    forward_rows(t.counts, t.log_alpha, a.shared, a.B, a.V, normalize, t.out(out));
  });
  return out;
}

}  // namespace cpu
}  // namespace dirmult
