// The shared-alpha forward over rows, which log_lik and log_lik_components
// share (defined in log_lik_cpu.cpp for every compute and count type).
#pragma once

#include <cstdint>

#include "tables_cpu.h"

namespace dirmult {
namespace cpu {

// out[b * stride] = log_lik(counts[b], la) for each row b of counts (B, V),
// with the table as planned (forward_plan).
template <typename scalar_t, typename count_t>
void forward_shared(const count_t* counts, const scalar_t* la, int64_t B, int64_t V,
                    bool normalize, const TablePlan& plan, scalar_t* out, int64_t stride);

}  // namespace cpu
}  // namespace dirmult
