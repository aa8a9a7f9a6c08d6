// Argument checks of the CSR ops (dirmult::log_lik_csr and its backward)
// that read no data, and the forward's output shape: the backstop for direct torch.ops.dirmult.* callers.
// The Python wrappers (python/dirmult_ext/ops/checks.py) run the same checks
// first, and with validate=True those that read the indices. The kernels
// never read out of bounds whatever the indices hold. See Note [CSR inputs].
#pragma once

#include <vector>

#include "tensor_checks.h"

namespace dirmult {

// The forward's output: (B,) for (V,) log_alpha, (B, K) for (K, V).
inline std::vector<int64_t> csr_out_shape(int64_t B, const Tensor& log_alpha) {
  if (log_alpha.dim() == 1) return {B};
  return {B, log_alpha.size(0)};
}

inline bool is_index_dtype(ScalarType t) { return t == ScalarType::Int || t == ScalarType::Long; }

// crow (B + 1,), col (nnz,), val (nnz,), log_alpha (V,) or (K, V).
inline void check_csr_parts(const Tensor& crow, const Tensor& col, const Tensor& val,
                            const Tensor& log_alpha) {
  STD_TORCH_CHECK(crow.dim() == 1 && col.dim() == 1 && val.dim() == 1,
                  "dirmult: crow_indices, col_indices and values must be 1-d");
  STD_TORCH_CHECK(crow.numel() >= 1, "dirmult: crow_indices must have B + 1 >= 1 entries");
  STD_TORCH_CHECK(is_index_dtype(crow.scalar_type()) && col.scalar_type() == crow.scalar_type(),
                  "dirmult: crow_indices and col_indices must both be int32 or both int64");
  STD_TORCH_CHECK(val.scalar_type() == ScalarType::Float || val.scalar_type() == ScalarType::Double,
                  "dirmult: values must be float32 or float64");
  STD_TORCH_CHECK(col.numel() == val.numel(),
                  "dirmult: col_indices and values must have the same length");
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()),
                  "dirmult: log_alpha must be float32 or float64");
  STD_TORCH_CHECK(log_alpha.dim() == 1 || log_alpha.dim() == 2,
                  "dirmult: log_alpha must be (V,) or (K, V) with CSR counts");
  check_same_device(crow, "crow_indices", col, "col_indices");
  check_same_device(crow, "crow_indices", val, "values");
  check_same_device(crow, "crow_indices", log_alpha, "log_alpha");
}

// log_lik_csr_with_grad: the forward's parts, log_alpha (V,) only.
inline void check_csr_with_grad_parts(const Tensor& crow, const Tensor& col, const Tensor& val,
                                      const Tensor& log_alpha) {
  check_csr_parts(crow, col, val, log_alpha);
  STD_TORCH_CHECK(log_alpha.dim() == 1,
                  "dirmult: log_lik_csr_with_grad takes log_alpha of shape (V,), shared by all "
                  "rows");
}

// The backward's extra parts: grad (B,) or (B, K) in log_alpha's dtype; the
// column-sorted copy csc_ptr (V + 1,), csc_row (nnz,), csc_val (nnz,).
inline void check_csr_backward_parts(const Tensor& grad, const Tensor& crow, const Tensor& val,
                                     const Tensor& csc_ptr, const Tensor& csc_row,
                                     const Tensor& csc_val, const Tensor& log_alpha) {
  check_csr_parts(crow, csc_row, val, log_alpha);
  const int64_t B = crow.numel() - 1, V = log_alpha.size(log_alpha.dim() - 1);
  STD_TORCH_CHECK(csc_ptr.dim() == 1 && csc_ptr.numel() == V + 1 &&
                      csc_ptr.scalar_type() == crow.scalar_type(),
                  "dirmult: csc_ptr must be (V + 1,) of crow_indices' dtype");
  STD_TORCH_CHECK(csc_val.dim() == 1 && csc_val.numel() == val.numel() &&
                      csc_val.scalar_type() == val.scalar_type(),
                  "dirmult: csc_values must be values' length and dtype");
  STD_TORCH_CHECK(grad.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: grad must have log_alpha's dtype");
  const bool shared = log_alpha.dim() == 1;
  STD_TORCH_CHECK(shared ? (grad.dim() == 1 && grad.size(0) == B)
                         : (grad.dim() == 2 && grad.size(0) == B &&
                            grad.size(1) == log_alpha.size(0)),
                  "dirmult: grad must be (B,) for (V,) log_alpha, (B, K) for (K, V)");
  check_same_device(crow, "crow_indices", grad, "grad");
  check_same_device(crow, "crow_indices", csc_ptr, "csc_ptr");
  check_same_device(crow, "crow_indices", csc_val, "csc_values");
}

}  // namespace dirmult
