// The dirmult operator schemas: defined once here, implemented per dispatch
// key in src/cpu and src/cuda, given autograd and fake kernels in
// python/dirmult_ext/_ops.py.
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
}
