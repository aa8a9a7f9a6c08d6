// The shared-alpha backward over rows, which log_lik_backward,
// log_lik_with_grad and log_lik_components_backward share (defined in
// log_lik_backward_cpu.cpp for every compute and count type).
#pragma once

#include <cstdint>

#include "tables_cpu.h"

namespace dirmult {
namespace cpu {

// Where backward_shared also writes the rows' log-likelihoods
// (log_lik_with_grad: unit row weights, one read of the counts).
template <typename scalar_t>
struct RowOutputs {
  bool normalize = false;
  scalar_t* out = nullptr;
};

// Shared alpha: grad_la[v] = sum_b g_b adpoch(a_v, n_bv) - a_v S with
// S = sum_b g_b dpoch(A, N_b), for counts (B, V) and row weights g = grad
// (nullptr: unit weights). Rows with g_b = 0 are skipped, bad counts and all
// (See Note [Zero-weight rows]). kRows: also the rows' log-likelihoods into
// rows.out, from a second table (lnpoch) read in the same pass (See Note
// [Single pass]).
// given_plan: backward_plan's, or nullptr to make it here.
template <typename scalar_t, typename count_t, bool kRows = false>
void backward_shared(const scalar_t* grad, const count_t* counts, const scalar_t* la, int64_t B,
                     int64_t V, scalar_t* grad_la, RowOutputs<scalar_t> rows = {},
                     const TablePlan* given_plan = nullptr);

}  // namespace cpu
}  // namespace dirmult
