// The CPU kernels of the dirmult ops.
#include <torch/csrc/stable/library.h>

#include "../common/safe_box.h"
#include "ops_cpu.h"

STABLE_TORCH_LIBRARY_IMPL(dirmult, CPU, m) {
  m.impl("log_lik", DM_BOX(&dirmult::cpu::log_lik_cpu));
  m.impl("log_lik_backward", DM_BOX(&dirmult::cpu::log_lik_backward_cpu));
  m.impl("log_lik_components", DM_BOX(&dirmult::cpu::log_lik_components_cpu));
  m.impl("log_lik_components_backward", DM_BOX(&dirmult::cpu::log_lik_components_backward_cpu));
  m.impl("log_lik_with_grad", DM_BOX(&dirmult::cpu::log_lik_with_grad_cpu));
  m.impl("poch_terms", DM_BOX(&dirmult::cpu::poch_terms_cpu));
  m.impl("tpoch_terms", DM_BOX(&dirmult::cpu::tpoch_terms_cpu));
  m.impl("log_lik_csr", DM_BOX(&dirmult::cpu::log_lik_csr_cpu));
  m.impl("log_lik_csr_backward", DM_BOX(&dirmult::cpu::log_lik_csr_backward_cpu));
  m.impl("log_lik_csr_with_grad", DM_BOX(&dirmult::cpu::log_lik_csr_with_grad_cpu));
  m.impl("log_lik_regression", DM_BOX(&dirmult::cpu::log_lik_regression_cpu));
  m.impl("log_lik_regression_backward", DM_BOX(&dirmult::cpu::log_lik_regression_backward_cpu));
}
