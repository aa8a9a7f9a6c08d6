// dirmult::poch_terms on CPU: the elementwise terms lnpoch(alpha, n) and
// alpha dpoch(alpha, n) of math.h, exposed for the accuracy tests.
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <tuple>

#include "../common/op_args.h"
#include "dirmult/math.h"
#include "ops_cpu.h"

namespace dirmult {
namespace cpu {

std::tuple<Tensor, Tensor> poch_terms_cpu(Tensor log_alpha, Tensor n) {
  const PochTermsArgs<CpuDevice> args(log_alpha, n);
  Tensor lnp = torch::stable::empty_like(args.log_alpha);
  Tensor adp = torch::stable::empty_like(args.log_alpha);
  args.dispatch([&](auto t) {
    using scalar_t = typename decltype(t)::scalar_t;
    const scalar_t* la = t.log_alpha;
    const scalar_t* x = t.counts;
    scalar_t* o1 = t.out(lnp);
    scalar_t* o2 = t.out(adp);
    for (int64_t i = 0; i < args.size; ++i) {
      const scalar_t a = dm_exp(la[i]);
      o1[i] = lnpoch(a, la[i], x[i]);
      o2[i] = adpoch(a, x[i]);
    }
  });
  return {lnp, adp};
}

}  // namespace cpu
}  // namespace dirmult
