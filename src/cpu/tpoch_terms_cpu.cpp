// dirmult::tpoch_terms on CPU: the elementwise second-derivative terms
// (a2tpoch, dadpoch) of include/dirmult/math.h. See Note [Trigamma terms].
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <tuple>

#include "../common/op_args.h"
#include "dirmult/math.h"
#include "ops_cpu.h"

namespace dirmult {
namespace cpu {

std::tuple<Tensor, Tensor> tpoch_terms_cpu(Tensor log_alpha, Tensor n) {
  const PochTermsArgs<CpuDevice> args(log_alpha, n, "tpoch_terms");
  Tensor a2t = torch::stable::empty_like(args.log_alpha);
  Tensor dad = torch::stable::empty_like(args.log_alpha);
  args.dispatch([&](auto t) {
    using scalar_t = typename decltype(t)::scalar_t;
    scalar_t* o1 = t.out(a2t);
    scalar_t* o2 = t.out(dad);
    for (int64_t i = 0; i < args.size; ++i) {
      const TpochTerms r = tpoch_terms(t.log_alpha[i], t.counts[i]);
      o1[i] = static_cast<scalar_t>(r.a2tpoch);
      o2[i] = static_cast<scalar_t>(r.dadpoch);
    }
  });
  return {a2t, dad};
}

}  // namespace cpu
}  // namespace dirmult
