// dirmult::tpoch_terms on CPU: the elementwise second-derivative terms
// (a2tpoch, dadpoch) of include/dirmult/math.h. See Note [Trigamma terms].
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <tuple>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"
#include "dirmult/math.h"
#include "tpoch_terms_cpu.h"

namespace dirmult {

std::tuple<Tensor, Tensor> tpoch_terms_cpu(Tensor log_alpha, Tensor n) {
  STD_TORCH_CHECK(is_compute_dtype(log_alpha.scalar_type()) &&
                      n.scalar_type() == log_alpha.scalar_type(),
                  "dirmult: tpoch_terms takes float32/float64 log_alpha and n of one dtype");
  STD_TORCH_CHECK(log_alpha.numel() == n.numel(),
                  "dirmult: tpoch_terms needs log_alpha and n of one size");
  check_same_device(log_alpha, "log_alpha", n, "n");
  log_alpha = as_contiguous(log_alpha);
  n = as_contiguous(n);
  Tensor a2t = torch::stable::empty_like(log_alpha);
  Tensor dad = torch::stable::empty_like(log_alpha);
  DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
    const auto* la = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
    const auto* x = static_cast<const scalar_t*>(n.const_data_ptr());
    auto* o1 = static_cast<scalar_t*>(a2t.mutable_data_ptr());
    auto* o2 = static_cast<scalar_t*>(dad.mutable_data_ptr());
    for (int64_t i = 0; i < log_alpha.numel(); ++i) {
      const TpochTerms r = tpoch_terms(la[i], x[i]);
      o1[i] = static_cast<scalar_t>(r.a2tpoch);
      o2[i] = static_cast<scalar_t>(r.dadpoch);
    }
  });
  return {a2t, dad};
}

}  // namespace dirmult
