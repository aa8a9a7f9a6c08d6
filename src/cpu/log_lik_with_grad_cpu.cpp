// dirmult::log_lik_with_grad on CPU: the shared-alpha backward with unit row
// weights that also writes the rows' log-likelihoods, from one read of the
// counts (backward_shared with kRows; See Note [Single pass]).
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <tuple>

#include "../common/op_args.h"
#include "log_lik_backward_cpu.h"
#include "ops_cpu.h"
#include "policy_cpu.h"

namespace dirmult {
namespace cpu {

// A few long rows, which the forward and the backward split into column
// chunks, take the two of them.
std::tuple<Tensor, Tensor> log_lik_with_grad_cpu(Tensor counts, Tensor log_alpha,
                                                 bool normalize) {
  const LogLikArgs<CpuDevice> a(counts, log_alpha, check_log_lik_with_grad);
  if (a.empty() || few_long_rows(a.B, a.V)) {
    return log_lik_with_grad_from_ops(log_lik_cpu, log_lik_backward_cpu, a.counts, a.log_alpha,
                                      normalize);
  }
  Tensor out = torch::stable::new_empty(a.log_alpha, batch_shape(a.counts));  // every row written
  Tensor grad_la = torch::stable::new_empty(a.log_alpha, a.log_alpha.sizes());
  a.dispatch([&](auto t) {
    using T = decltype(t);
    backward_shared<typename T::scalar_t, typename T::count_t, true>(
        t.grad, t.counts, t.log_alpha, a.B, a.V, t.out(grad_la), {normalize, t.out(out)});
  });
  return {out, grad_la};
}

}  // namespace cpu
}  // namespace dirmult
