// Argument checks shared by the CPU and CUDA implementations. The Python
// wrappers check the same things first with friendlier ValueErrors; these are
// the backstop for direct torch.ops.dirmult.* callers.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace dirmult {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

inline bool is_supported_count_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
    case ScalarType::Double:
    case ScalarType::Half:
    case ScalarType::BFloat16:
    case ScalarType::Int:
    case ScalarType::Long:
    case ScalarType::Byte:
      return true;
    default:
      return false;
  }
}

inline bool is_compute_dtype(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double;
}

inline void check_same_device(const Tensor& a, const char* a_name,
                              const Tensor& b, const char* b_name) {
  STD_TORCH_CHECK(a.get_device_index() == b.get_device_index() &&
                      a.is_cuda() == b.is_cuda(),
                  "dirmult: ", a_name, " and ", b_name,
                  " must be on the same device");
}

inline void check_counts(const Tensor& counts) {
  STD_TORCH_CHECK(counts.dim() >= 1,
                  "dirmult: counts must have at least 1 dimension (..., V), "
                  "got a 0-d tensor");
  STD_TORCH_CHECK(is_supported_count_dtype(counts.scalar_type()),
                  "dirmult: counts must be float32, float64, float16, "
                  "bfloat16, int32, int64 or uint8");
}

// log_alpha is (V,) shared across rows, or counts' shape (per-sample).
// Returns true when shared.
inline bool check_log_alpha(const Tensor& counts, const Tensor& log_alpha) {
  check_counts(counts);
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()),
                  "dirmult: log_alpha must be float32 or float64 (it sets the "
                  "compute dtype)");
  check_same_device(counts, "counts", log_alpha, "log_alpha");
  const int64_t V = counts.size(counts.dim() - 1);
  if (log_alpha.dim() == 1 && counts.dim() != 1) {
    STD_TORCH_CHECK(log_alpha.size(0) == V, "dirmult: log_alpha has ",
                    log_alpha.size(0), " categories but counts has V=", V);
    return true;
  }
  STD_TORCH_CHECK(log_alpha.dim() == counts.dim(),
                  "dirmult: log_alpha must be (V,) or have counts' shape");
  for (int64_t d = 0; d < counts.dim(); ++d) {
    STD_TORCH_CHECK(log_alpha.size(d) == counts.size(d),
                    "dirmult: log_alpha must be (V,) or have counts' shape; "
                    "mismatch at dim ", d, ": ", log_alpha.size(d), " vs ",
                    counts.size(d));
  }
  return counts.dim() == 1;  // a 1-d counts vector with (V,) alpha is shared
}

// Returns K.
inline int64_t check_components(const Tensor& counts, const Tensor& log_alpha) {
  check_counts(counts);
  STD_TORCH_CHECK(counts.dim() == 2, "dirmult: counts must be (B, V) for log_lik_components");
  STD_TORCH_CHECK(log_alpha.dim() == 2, "dirmult: log_alpha must be (K, V) for log_lik_components");
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()),
                  "dirmult: log_alpha must be float32 or float64");
  STD_TORCH_CHECK(log_alpha.size(1) == counts.size(1), "dirmult: log_alpha has ",
                  log_alpha.size(1), " categories but counts has V=", counts.size(1));
  check_same_device(counts, "counts", log_alpha, "log_alpha");
  return log_alpha.size(0);
}

// t itself when already contiguous: a cheap query instead of a dispatcher
// call (aten::contiguous through the stable ABI costs microseconds per call,
// a large part of a small problem's time).
inline Tensor as_contiguous(const Tensor& t) {
  return t.is_contiguous() ? t : torch::stable::contiguous(t);
}

inline std::vector<int64_t> batch_shape(const Tensor& counts) {
  std::vector<int64_t> shape;
  for (int64_t d = 0; d + 1 < counts.dim(); ++d) shape.push_back(counts.size(d));
  return shape;
}

// Rows with at least one column (0 when V = 0: nothing to compute).
inline int64_t num_rows(const Tensor& counts) {
  const int64_t V = counts.size(counts.dim() - 1);
  return V == 0 ? 0 : counts.numel() / V;
}

// Elements of batch_shape(counts), V = 0 included (its rows still have a
// result, 0, and an incoming gradient).
inline int64_t batch_numel(const Tensor& counts) {
  int64_t n = 1;
  for (int64_t d = 0; d + 1 < counts.dim(); ++d) n *= counts.size(d);
  return n;
}

// log_lik_backward's counts-gradient output: counts' shape when requested,
// else empty (0,).
inline std::vector<int64_t> counts_grad_shape(const Tensor& counts, bool counts_grad) {
  if (!counts_grad) return {0};
  return std::vector<int64_t>(counts.sizes().begin(), counts.sizes().end());
}

// The backward ops' incoming gradient: on counts' device, in log_alpha's
// dtype, one value per row (log_lik) or per (row, component).
inline bool check_log_lik_backward(const Tensor& grad, const Tensor& counts,
                                   const Tensor& log_alpha) {
  const bool shared = check_log_alpha(counts, log_alpha);
  check_same_device(grad, "grad", counts, "counts");
  STD_TORCH_CHECK(grad.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: grad must have log_alpha's dtype");
  STD_TORCH_CHECK(grad.numel() == batch_numel(counts),
                  "dirmult: grad must have counts' batch shape");
  return shared;
}

// Returns K.
inline int64_t check_components_backward(const Tensor& grad, const Tensor& counts,
                                         const Tensor& log_alpha) {
  const int64_t K = check_components(counts, log_alpha);
  check_same_device(grad, "grad", counts, "counts");
  STD_TORCH_CHECK(grad.dim() == 2 && grad.size(0) == counts.size(0) &&
                      grad.size(1) == log_alpha.size(0),
                  "dirmult: grad must be (B, K)");
  STD_TORCH_CHECK(grad.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: grad must have log_alpha's dtype");
  return K;
}

// poch_terms' elementwise arguments. Returns their number of elements.
inline int64_t check_poch_terms(const Tensor& log_alpha, const Tensor& n,
                                const char* op = "poch_terms") {
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()) &&
                      n.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: ", op, " takes float32/float64 log_alpha and n of one dtype");
  STD_TORCH_CHECK(log_alpha.numel() == n.numel(),
                  "dirmult: ", op, " needs log_alpha and n of one size");
  check_same_device(log_alpha, "log_alpha", n, "n");
  return log_alpha.numel();
}

// log_lik_regression: counts (B, V), X (B, P), W (P, V), bias (V,) or
// none; X sets the compute dtype, W and bias share it; all on counts'
// device. The same checks and messages as _checks.op_log_lik_regression.
inline void check_regression(const Tensor& counts, const Tensor& X, const Tensor& W,
                             const std::optional<Tensor>& bias) {
  check_counts(counts);
  STD_TORCH_CHECK(counts.dim() == 2, "dirmult: counts must be (B, V) for log_lik_regression, got ",
                  counts.dim(), " dimensions");
  STD_TORCH_CHECK(X.dim() == 2, "dirmult: X must be (B, P) for log_lik_regression, got ", X.dim(),
                  " dimensions");
  STD_TORCH_CHECK(W.dim() == 2, "dirmult: W must be (P, V) for log_lik_regression, got ", W.dim(),
                  " dimensions");
  STD_TORCH_CHECK(is_compute_dtype(X.scalar_type()),
                  "dirmult: X must be float32 or float64 (it sets the compute dtype)");
  STD_TORCH_CHECK(W.scalar_type() == X.scalar_type(), "dirmult: W must have X's dtype");
  STD_TORCH_CHECK(X.size(0) == counts.size(0), "dirmult: X has ", X.size(0),
                  " rows but counts has B=", counts.size(0));
  STD_TORCH_CHECK(W.size(0) == X.size(1), "dirmult: W has ", W.size(0),
                  " rows but X has P=", X.size(1), " columns");
  STD_TORCH_CHECK(W.size(1) == counts.size(1), "dirmult: W has ", W.size(1),
                  " columns but counts has V=", counts.size(1));
  check_same_device(counts, "counts", X, "X");
  check_same_device(counts, "counts", W, "W");
  if (bias.has_value()) {
    STD_TORCH_CHECK(bias->dim() == 1 && bias->size(0) == counts.size(1),
                    "dirmult: bias must be (V,) with V=", counts.size(1));
    STD_TORCH_CHECK(bias->scalar_type() == X.scalar_type(), "dirmult: bias must have X's dtype");
    check_same_device(counts, "counts", *bias, "bias");
  }
}

// log_lik_regression_backward: the regression's arguments and one incoming
// gradient per row, in X's dtype on counts' device.
inline void check_regression_backward(const Tensor& grad, const Tensor& counts, const Tensor& X,
                                      const Tensor& W, const std::optional<Tensor>& bias) {
  check_regression(counts, X, W, bias);
  check_same_device(grad, "grad", counts, "counts");
  STD_TORCH_CHECK(grad.scalar_type() == X.scalar_type(), "dirmult: grad must have X's dtype");
  STD_TORCH_CHECK(grad.dim() == 1 && grad.size(0) == counts.size(0),
                  "dirmult: grad must be (B,) with B=", counts.size(0));
}

}  // namespace dirmult
