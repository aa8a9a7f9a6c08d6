// dirmult::log_lik_regression and its backward on CUDA (See Note
// [Regression fusion]).
//
//   P <= regression_max_fused_p (policy.h):
//     forward:  regression_forward_kernel, then finish_rows_kernel where a
//               row spans several column tiles
//     backward: regression_forward_kernel's row totals (several tiles only),
//               regression_backward_kernel, then regression_sum_partials_kernel
//               for dW, dbias (over the row groups) and dX (over the tiles)
//   larger P:   log_alpha = X W + bias by one matmul (a (B, V) tensor), then
//               log_lik's per-sample kernels and, for the backward, two
//               matmuls and a column sum of their gradient.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>

#include <optional>
#include <tuple>
#include <vector>

#include "../common/count_dispatch.h"
#include "../common/op_args.h"
#include "kernels/ceil_div.cuh"
#include "kernels/regression_backward.cuh"
#include "kernels/regression_forward.cuh"
#include "kernels/vector_loads.cuh"
#include "launch.h"
#include "launch_forward_rows.cuh"
#include "ops_cuda.h"
#include "policy.h"
#include "scratch.h"
#include "tensors.h"

namespace dirmult {
namespace cuda {
namespace {

// RegressionArgs' device: the guard, the counts in a dtype the kernels
// read (native_counts) and the dispatch over those.
struct CudaDevice {
  struct Guard {
    torch::stable::accelerator::DeviceGuard guard;
    explicit Guard(const Tensor& counts) : guard(counts.get_device_index()) {}
  };
  static Tensor counts(const Tensor& counts) { return native_counts(counts); }
  template <typename Fn>
  static void dispatch(ScalarType compute, ScalarType count, Fn&& fn) {
    DM_DISPATCH_COMPUTE(compute, [&] {
      DM_DISPATCH_NATIVE_COUNTS(count, [&] { fn(Types<scalar_t, count_t>{}); });
    });
  }
};

using Args = RegressionArgs<CudaDevice>;

// The fused kernels' grid: row groups (x) over column tiles (y).
struct RegressionGrid {
  int64_t groups, tiles, rows_per_group;
};

RegressionGrid regression_grid(int64_t B, int64_t V, int tile, int rows, int64_t wave) {
  const int64_t tiles = ceil_div(V, static_cast<int64_t>(tile));
  const int64_t groups = regression_row_groups(B, tiles, rows, wave);
  const int64_t rows_per_group = ceil_div(B, groups);
  return {ceil_div(B, rows_per_group), tiles, rows_per_group};
}

// The fused kernels of one shape case (with_regression_shape).
template <typename scalar_t, typename count_t, int kCols, int kMaxP, int kRows>
struct Fused {
  static constexpr int kThreads = kRegressionThreads;
  static constexpr int kTile = kThreads * kCols;
  static constexpr auto kForward =
      regression_forward_kernel<scalar_t, count_t, kCols, kMaxP, kRows, kThreads>;
  static constexpr auto kBackward =
      regression_backward_kernel<scalar_t, count_t, kCols, kMaxP, kRows, kThreads>;
  static constexpr size_t kForwardSmem = sizeof(scalar_t) * kMaxP * kTile;
  static constexpr size_t kBackwardSmem =
      sizeof(scalar_t) * regression_backward_smem_values<kCols, kMaxP, kRows, kThreads>();

  static bool aligned(const count_t* n, int64_t V) {
    return V % kCols == 0 &&
           reinterpret_cast<uintptr_t>(n) % (kCols * sizeof(count_t)) == 0;
  }

  // out (one tile) or the (B, tiles) partials; totals_only: N and A alone.
  static RegressionGrid forward(const RegressionTyped<scalar_t, count_t>& t, int64_t B, int64_t V,
                                int P, bool normalize, bool totals_only, scalar_t* out,
                                RowPartial* partial, cudaStream_t stream) {
    const RegressionGrid g =
        regression_grid(B, V, kTile, kRows, one_wave_blocks<kForward>(kThreads, kForwardSmem));
    kForward<<<dim3(static_cast<unsigned>(g.groups), static_cast<unsigned>(g.tiles)), kThreads,
               kForwardSmem, stream>>>(t.counts, t.X, t.W, t.bias, B, V, P, g.rows_per_group,
                                       aligned(t.counts, V), normalize, totals_only, out,
                                       partial);
    DM_CUDA_CHECK_LAUNCH();
    return g;
  }

  static int64_t tiles(int64_t V) { return ceil_div(V, static_cast<int64_t>(kTile)); }

  static void log_lik(const Args& a, const RegressionTyped<scalar_t, count_t>& t, bool normalize,
                      scalar_t* out, cudaStream_t stream) {
    const int64_t num_tiles = tiles(a.V);
    Tensor ws;
    RowPartial* partial = nullptr;
    if (num_tiles > 1) {
      ws = workspace(a.counts, a.B * num_tiles * static_cast<int64_t>(sizeof(RowPartial)));
      partial = static_cast<RowPartial*>(ws.mutable_data_ptr());
    }
    forward(t, a.B, a.V, static_cast<int>(a.P), normalize, false, out, partial, stream);
    if (num_tiles > 1) {
      launch_finish_rows<scalar_t>(partial, nullptr, 0, a.B, 1, num_tiles, true, normalize, out,
                                   stream);
    }
  }

  static void backward(const Args& a, const RegressionTyped<scalar_t, count_t>& t, scalar_t* dX,
                       scalar_t* dW, scalar_t* dbias, cudaStream_t stream) {
    const int64_t B = a.B, V = a.V, P = a.P;
    const int Pi = static_cast<int>(P);
    const RegressionGrid g =
        regression_grid(B, V, kTile, kRows, one_wave_blocks<kBackward>(kThreads, kBackwardSmem));
    const bool has_bias = dbias != nullptr;
    ScratchLayout layout;
    const int64_t totals_at =
        layout.add(g.tiles > 1 ? B * g.tiles * static_cast<int64_t>(sizeof(RowPartial)) : 0);
    const int64_t dx_at = layout.add(g.tiles > 1 ? g.tiles * B * P * sizeof(scalar_t) : 0);
    const int64_t dw_at = layout.add(g.groups * P * V * sizeof(scalar_t));
    const int64_t db_at = layout.add(has_bias ? g.groups * V * sizeof(scalar_t) : 0);
    const Tensor ws = workspace(a.counts, layout.size());
    RowPartial* totals = nullptr;
    scalar_t* dX_part = nullptr;
    if (g.tiles > 1) {
      totals = ScratchLayout::at<RowPartial>(ws, totals_at);
      dX_part = ScratchLayout::at<scalar_t>(ws, dx_at);
      forward(t, B, V, Pi, false, true, nullptr, totals, stream);
    }
    scalar_t* dW_part = ScratchLayout::at<scalar_t>(ws, dw_at);
    scalar_t* dbias_part = has_bias ? ScratchLayout::at<scalar_t>(ws, db_at) : nullptr;
    kBackward<<<dim3(static_cast<unsigned>(g.groups), static_cast<unsigned>(g.tiles)), kThreads,
                kBackwardSmem, stream>>>(t.grad, t.counts, t.X, t.W, t.bias, totals, B, V, Pi,
                                         g.rows_per_group, aligned(t.counts, V), dX, dX_part,
                                         dW_part, dbias_part);
    DM_CUDA_CHECK_LAUNCH();
    sum_partials(dW_part, g.groups, P * V, dW, stream);
    if (has_bias) sum_partials(dbias_part, g.groups, V, dbias, stream);
    if (g.tiles > 1) sum_partials(dX_part, g.tiles, B * P, dX, stream);
  }

  static void sum_partials(const scalar_t* part, int64_t parts, int64_t n, scalar_t* out,
                           cudaStream_t stream) {
    if (n == 0) return;
    const int64_t blocks = std::min<int64_t>(ceil_div(n, int64_t{256}), 4096);
    regression_sum_partials_kernel<scalar_t>
        <<<static_cast<unsigned>(blocks), 256, 0, stream>>>(part, parts, n, out);
    DM_CUDA_CHECK_LAUNCH();
  }
};

// Whether the fused kernels take P (and a grid of at most 65535 tiles).
template <typename scalar_t>
bool fused_applies(int64_t P, int64_t V) {
  if (P > regression_max_fused_p<scalar_t>()) return false;
  bool fits = true;
  with_regression_shape<scalar_t>(P, [&](auto cols, auto, auto) {
    fits = ceil_div(V, static_cast<int64_t>(kRegressionThreads * decltype(cols)::value)) <= 65535;
  });
  return fits;
}

// The unfused way's log_alpha (B, V) = X W + bias: [X, 1] [W; bias], one
// matmul with the bias in it.
Tensor design_log_alpha(const Args& a) {
  if (!a.bias.has_value()) return torch::stable::matmul(a.X, a.W);
  const Tensor X1 = torch::stable::pad(a.X, {0, 1}, "constant", 1.0);
  Tensor W1 = torch::stable::pad(a.W, {0, 0, 0, 1});
  Tensor last = torch::stable::narrow(W1, 0, a.P, 1);
  torch::stable::copy_(last, torch::stable::reshape(*a.bias, {1, a.V}));
  return torch::stable::matmul(X1, W1);
}

bool fused(const Args& a) {
  return a.X.scalar_type() == ScalarType::Float ? fused_applies<float>(a.P, a.V)
                                                : fused_applies<double>(a.P, a.V);
}

}  // namespace

Tensor log_lik_regression_cuda(Tensor counts, Tensor X, Tensor W, std::optional<Tensor> bias,
                               bool normalize) {
  const Args a(counts, X, W, bias);
  if (a.empty()) return torch::stable::new_zeros(a.X, {a.B});
  if (!fused(a)) return log_lik_cuda(a.counts, design_log_alpha(a), normalize);
  Tensor out = torch::stable::new_empty(a.X, {a.B});  // every row written
  const cudaStream_t stream = current_stream(a.counts.get_device_index());
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    using C = typename decltype(t)::count_t;
    with_regression_shape<S>(a.P, [&](auto cols, auto max_p, auto rows) {
      Fused<S, C, decltype(cols)::value, decltype(max_p)::value, decltype(rows)::value>::log_lik(
          a, t, normalize, t.out(out), stream);
    });
  });
  return out;
}

std::tuple<Tensor, Tensor, Tensor> log_lik_regression_backward_cuda(Tensor grad, Tensor counts,
                                                                    Tensor X, Tensor W,
                                                                    std::optional<Tensor> bias,
                                                                    bool normalize) {
  // (normalize adds a term free of log_alpha: the gradient is the same.)
  const Args a(grad, counts, X, W, bias);
  const int64_t bias_size = a.bias.has_value() ? a.V : 0;
  if (a.empty()) {
    return {torch::stable::new_zeros(a.X, {a.B, a.P}), torch::stable::new_zeros(a.X, {a.P, a.V}),
            torch::stable::new_zeros(a.X, {bias_size})};
  }
  if (!fused(a)) {
    const Tensor grad_la =
        std::get<0>(log_lik_backward_cuda(*a.grad, a.counts, design_log_alpha(a), normalize, false));
    Tensor dX = torch::stable::matmul(grad_la, torch::stable::transpose(a.W, 0, 1));
    Tensor dW = torch::stable::matmul(torch::stable::transpose(a.X, 0, 1), grad_la);
    Tensor dbias = a.bias.has_value()
                       ? torch::stable::sum(grad_la, std::vector<int64_t>{0})
                       : torch::stable::new_zeros(a.X, {0});
    return {dX, dW, dbias};
  }
  // Every element of the three is written.
  Tensor dX = torch::stable::new_empty(a.X, {a.B, a.P});
  Tensor dW = torch::stable::new_empty(a.X, {a.P, a.V});
  Tensor dbias = torch::stable::new_empty(a.X, {bias_size});
  const cudaStream_t stream = current_stream(a.counts.get_device_index());
  a.dispatch([&](auto t) {
    using S = typename decltype(t)::scalar_t;
    using C = typename decltype(t)::count_t;
    with_regression_shape<S>(a.P, [&](auto cols, auto max_p, auto rows) {
      Fused<S, C, decltype(cols)::value, decltype(max_p)::value, decltype(rows)::value>::backward(
          a, t, t.out(dX), t.out(dW), a.bias.has_value() ? t.out(dbias) : nullptr, stream);
    });
  });
  return {dX, dW, dbias};
}

}  // namespace cuda
}  // namespace dirmult
