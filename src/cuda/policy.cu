// Host policy of the CUDA ops (policy.h): the choices and their reasons.
#include "policy.h"

#include <torch/headeronly/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "components_rule_coefs.h"
#include "kernels/ceil_div.cuh"
#include "kernels/forward_table_ring.cuh"
#include "kernels/row_chunks.cuh"

namespace dirmult {
namespace cuda {
namespace {

// Two rows in flight per warp where every warp has at least this many rows.
constexpr int64_t kMinRowsPerWarpForTwo = 16;

// Blocks fill their own table slices (See Note [Fill in block]) where the
// grid has one row group over at least this many chunks: with fewer, few
// blocks fill 1024 columns each where the global fill spreads its entries
// over every SM (BENCHMARKS.md).
constexpr int64_t kFillInBlockMinChunks = 32;

// log_lik_with_grad's: from this many column chunks in a grid of one row
// tile (BENCHMARKS.md).
constexpr int64_t kWithGradFillMinChunks = 64;

}  // namespace

int64_t table_row_groups(int64_t B, int64_t num_chunks, int warps, int64_t wave) {
  return std::max<int64_t>(1, std::min(ceil_div(B, warps), wave / num_chunks));
}

TableForward pick_table_forward(int64_t B, int64_t V, bool float_counts, size_t count_bytes,
                                bool aligned, const TableForwardDevice& device) {
  const int64_t num_chunks = ceil_div(V, kTableChunk);
  // One row group over many chunks: each slice of a global table would be
  // written once and read once, after a fill every block waits for.
  if (num_chunks >= kFillInBlockMinChunks &&
      table_row_groups(B, num_chunks, kRowWarps, device.one_row_wave) == 1) {
    // Float32 aligned rows: one persistent block per SM that also computes
    // alpha's partial totals and finishes its rows, so nothing runs before
    // it and one launch fewer (BENCHMARKS.md).
    if (float_counts && aligned &&
        device.max_smem_optin >= static_cast<int>(kRingSmemBytes + kRingFillStaticBytes)) {
      return TableForward::kFillRing;
    }
    return TableForward::kFillInBlock;
  }
  // Float32 aligned counts take the ring kernel (a block per SM) where its
  // grid is one wave, and where every warp has many rows only if the chunks
  // spread evenly over the SMs (BENCHMARKS.md).
  const bool many_rows = B * num_chunks >= kMinRowsPerWarpForTwo * kRowWarps * device.one_row_wave;
  if (float_counts && aligned &&
      (many_rows ? device.sms % num_chunks == 0 : num_chunks <= device.sms) &&
      device.max_smem_optin >= static_cast<int>(kRingSmemBytes)) {
    return TableForward::kRing;
  }
  // Two rows in flight per warp where every warp has many rows, or where the
  // grid is the same either way and its warps have two rows or more: the same
  // blocks with twice the bytes in flight. One where the one-row kernel's
  // grid has more blocks (its block takes fewer resources), and for 8-byte
  // counts (registers). BENCHMARKS.md has the timings.
  if (count_bytes <= 4) {
    const int64_t groups = table_row_groups(B, num_chunks, kRowWarps, device.one_row_wave);
    const bool same_grid =
        table_row_groups(B, num_chunks, kRowWarps, device.two_row_wave) == groups;
    if (many_rows || (same_grid && B >= 2 * kRowWarps * groups)) return TableForward::kTwoRows;
  }
  return TableForward::kOneRow;
}

bool with_grad_fills_in_block(int64_t row_tiles, int64_t col_chunks) {
  // One row tile over many chunks: each block fills its own slices, as each
  // slice of a global table would be written once and read once (See Note
  // [Fill in block]).
  return row_tiles == 1 && col_chunks >= kWithGradFillMinChunks;
}

ComponentsWay components_way_setting() {
  static const ComponentsWay way = [] {
    const char* e = std::getenv("DIRMULT_CUDA_COMPONENTS");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "auto") == 0) return ComponentsWay::kByRule;
    if (std::strcmp(e, "fused") == 0) return ComponentsWay::kFused;
    STD_TORCH_CHECK(std::strcmp(e, "per_component") == 0,
                    "dirmult: DIRMULT_CUDA_COMPONENTS must be auto, fused or per_component, got '",
                    e, "'");
    return ComponentsWay::kPerComponent;
  }();
  return way;
}

namespace {

// Whether to run log_lik's kernels once per component, given the rule's pick.
bool per_component(bool rule_picks_it) {
  switch (components_way_setting()) {
    case ComponentsWay::kFused:
      return false;
    case ComponentsWay::kPerComponent:
      return true;
    default:
      return rule_picks_it;
  }
}

}  // namespace

// Each way's GPU time (us) is a linear model in a few shape features, fitted
// to H200 measurements by scripts/codegen/gen_components_rule.py (the data:
// scripts/tuning/data/components_crossover_h200.txt; BENCHMARKS.md). The fused
// kernels read the counts once, but their fills cost per (component, column)
// and their few-row grids are small: K log_lik calls win for long rows and
// few components, the fused kernels for short rows and many components.
bool components_as_shared_forward(int64_t B, int64_t V, int64_t K) {
  namespace c = components_rule;
  const double b = static_cast<double>(B), v = static_cast<double>(V), k = static_cast<double>(K);
  const double shared = c::kSharedForward[0] * k + c::kSharedForward[1] * k * v +
                        c::kSharedForward[2] * k * b * v;
  const double fused = c::kFusedForward[0] + c::kFusedForward[1] * k * v +
                       c::kFusedForward[2] * b * v + c::kFusedForward[3] * k * b * v;
  return shared < fused;
}

// The backward's fused way is the math path below
// kComponentBackwardTableMinRows rows (a cost per row, and per element per
// block of 4 components), else the component tables (whose cost per element
// grows with V).
bool components_as_shared_backward(int64_t B, int64_t V, int64_t K) {
  namespace c = components_rule;
  const double b = static_cast<double>(B), v = static_cast<double>(V), k = static_cast<double>(K);
  const double shared = c::kSharedBackward[0] * k + c::kSharedBackward[1] * k * v +
                        c::kSharedBackward[2] * k * b * v;
  const double blocks = static_cast<double>((K + 3) / 4);
  const double fused =
      B < kComponentBackwardTableMinRows
          ? c::kFusedBackwardMath[0] + c::kFusedBackwardMath[1] * k * v +
                c::kFusedBackwardMath[2] * b + c::kFusedBackwardMath[3] * blocks * b * v
          : c::kFusedBackwardTable[0] + c::kFusedBackwardTable[1] * k * v +
                c::kFusedBackwardTable[2] * b * v + c::kFusedBackwardTable[3] * b * v * v;
  return shared < fused;
}

bool components_per_component_forward(int64_t B, int64_t V, int64_t K) {
  return per_component(components_as_shared_forward(B, V, K));
}

bool components_per_component_backward(int64_t B, int64_t V, int64_t K) {
  return per_component(components_as_shared_backward(B, V, K));
}

}  // namespace cuda
}  // namespace dirmult
