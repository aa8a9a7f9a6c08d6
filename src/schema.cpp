// The dirmult operator schemas: defined once here, implemented per dispatch
// key in src/cpu and src/cuda, given autograd and fake kernels in
// python/dirmult_ext/ops/.
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(dirmult, m) {
  // counts (..., V); log_alpha (V,) shared or counts' shape. Returns (...).
  m.def("log_lik(Tensor counts, Tensor log_alpha, bool normalize=False) -> Tensor");
  // Returns (grad_log_alpha shaped like log_alpha, grad_counts shaped like
  // counts when counts_grad else an empty (0,) tensor).
  m.def(
      "log_lik_backward(Tensor grad, Tensor counts, Tensor log_alpha, "
      "bool normalize, bool counts_grad) -> (Tensor, Tensor)");
  // log_lik and the gradient of its sum with respect to log_alpha (V,), from
  // one read of the counts where the kernels allow: the backward of a sum or
  // mean of the rows is then a scale of it.
  m.def(
      "log_lik_with_grad(Tensor counts, Tensor log_alpha, bool normalize=False) "
      "-> (Tensor, Tensor)");
  // counts (B, V); log_alpha (K, V) components. Returns (B, K).
  m.def(
      "log_lik_components(Tensor counts, Tensor log_alpha, bool normalize=False) "
      "-> Tensor");
  // grad (B, K) -> grad_log_alpha (K, V).
  m.def(
      "log_lik_components_backward(Tensor grad, Tensor counts, Tensor log_alpha) "
      "-> Tensor");
  // Elementwise terms (lnpoch(alpha, n), alpha * dpoch(alpha, n)) with
  // alpha = exp(log_alpha), in log_alpha's dtype: the shared math, exposed
  // for accuracy tests.
  m.def("poch_terms(Tensor log_alpha, Tensor n) -> (Tensor, Tensor)");
  // Elementwise (alpha^2 tpoch(alpha, n), d[alpha dpoch(alpha, n)]/d log_alpha): the
  // second-derivative terms of the double backward (See Note [Trigamma terms]).
  m.def("tpoch_terms(Tensor log_alpha, Tensor n) -> (Tensor, Tensor)");
  // Counts as CSR parts (See Note [CSR inputs]): crow_indices (B + 1,),
  // col_indices (nnz,) of one integer dtype, values (nnz,) float32/float64;
  // log_alpha (V,) shared -> (B,), or (K, V) components -> (B, K).
  m.def(
      "log_lik_csr(Tensor crow_indices, Tensor col_indices, Tensor values, Tensor log_alpha, "
      "bool normalize=False) -> Tensor");
  // grad (B,) or (B, K) -> grad_log_alpha shaped like log_alpha, from the
  // rows' totals (crow_indices, values) and the column-sorted copy
  // csc_ptr (V + 1,), csc_rows (nnz,), csc_values (nnz,) (See Note [CSR gradient]).
  m.def(
      "log_lik_csr_backward(Tensor grad, Tensor crow_indices, Tensor values, Tensor csc_ptr, "
      "Tensor csc_rows, Tensor csc_values, Tensor log_alpha) -> Tensor");
  // The single pass for CSR counts (See Note [Single pass]): (out (B,), the
  // gradient of out's sum with respect to a shared log_alpha (V,)).
  m.def(
      "log_lik_csr_with_grad(Tensor crow_indices, Tensor col_indices, Tensor values, "
      "Tensor log_alpha, bool normalize=False) -> (Tensor, Tensor)");
  // The DM regression (See Note [Regression fusion]): counts (B, V), X (B,
  // P), W (P, V), bias (V,) or None; per row log_alpha = X[b] W + bias,
  // made inside the op. Returns (B,).
  m.def(
      "log_lik_regression(Tensor counts, Tensor X, Tensor W, Tensor? bias=None, "
      "bool normalize=False) -> Tensor");
  // grad (B,) -> (grad_X (B, P), grad_W (P, V), grad_bias (V,), or an empty
  // (0,) tensor when bias is None). No gradient with respect to counts.
  m.def(
      "log_lik_regression_backward(Tensor grad, Tensor counts, Tensor X, Tensor W, "
      "Tensor? bias, bool normalize) -> (Tensor, Tensor, Tensor)");
}
