// The CUDA registrations of the dirmult ops.
#include <torch/csrc/stable/library.h>

#include "../common/safe_box.h"
#include "ops_cuda.h"

STABLE_TORCH_LIBRARY_IMPL(dirmult, CUDA, m) {
  m.impl("log_lik", DM_BOX(&dirmult::cuda::log_lik_cuda));
  m.impl("log_lik_backward", DM_BOX(&dirmult::cuda::log_lik_backward_cuda));
  m.impl("log_lik_components", DM_BOX(&dirmult::cuda::log_lik_components_cuda));
  m.impl("log_lik_components_backward", DM_BOX(&dirmult::cuda::log_lik_components_backward_cuda));
  m.impl("log_lik_with_grad", DM_BOX(&dirmult::cuda::log_lik_with_grad_cuda));
  m.impl("poch_terms", DM_BOX(&dirmult::cuda::poch_terms_cuda));
  m.impl("tpoch_terms", DM_BOX(&dirmult::cuda::tpoch_terms_cuda));
  m.impl("log_lik_csr", DM_BOX(&dirmult::cuda::log_lik_csr_cuda));
  m.impl("log_lik_csr_backward", DM_BOX(&dirmult::cuda::log_lik_csr_backward_cuda));
  m.impl("log_lik_regression", DM_BOX(&dirmult::cuda::log_lik_regression_cuda));
  m.impl("log_lik_regression_backward", DM_BOX(&dirmult::cuda::log_lik_regression_backward_cuda));
}
