// The preamble of every op entry point, written once: the argument checks
// (tensor_checks.h), the inputs made contiguous, the problem's sizes and
// whether there is anything to compute; and a dispatch over the compute and
// count dtypes that hands the body typed data pointers. Host code of either
// backend; a Device type says what differs between them:
//
//   struct Device {
//     // Alive for the call from after the checks (CUDA: a DeviceGuard).
//     struct Guard { explicit Guard(const Tensor& counts); };
//     // The counts as the device's kernels read them (contiguous).
//     static Tensor counts(const Tensor& counts);
//     // fn(Types<scalar_t, count_t>{}) for the count dtypes it builds.
//     template <typename Fn>
//     static void dispatch(ScalarType compute, ScalarType count, Fn&& fn);
//   };
//
// Use (CpuDevice below):
//
//   Tensor log_lik_cpu(Tensor counts, Tensor log_alpha, bool normalize) {
//     const LogLikArgs<CpuDevice> a(counts, log_alpha);
//     if (a.empty()) return torch::stable::new_zeros(a.log_alpha, batch_shape(a.counts));
//     Tensor out = torch::stable::new_empty(a.log_alpha, batch_shape(a.counts));
//     a.dispatch([&](auto t) {  // t.counts, t.log_alpha, t.grad: typed pointers
//       forward_rows(t.counts, t.log_alpha, a.shared, a.B, a.V, normalize, t.out(out));
//     });
//     return out;
//   }
//
// Inside the body, decltype(t)::scalar_t and ::count_t name the types. The
// other ops: LogLikBackwardArgs(grad, counts, log_alpha), LogLikArgs(counts,
// log_alpha, check_log_lik_with_grad), ComponentsArgs(counts, log_alpha),
// ComponentsBackwardArgs(grad, counts, log_alpha), PochTermsArgs(log_alpha,
// n), RegressionArgs(counts, X, W, bias) and its backward's (with grad),
// CsrArgs(crow, col, val, log_alpha) and CsrBackwardArgs(grad, crow, val,
// csc_ptr, csc_row, csc_val, log_alpha) (their dispatch is over the compute
// dtype and the CSR parts' index and value dtypes).
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <type_traits>

#include "count_dispatch.h"
#include "csr_checks.h"
#include "csr_dispatch.h"
#include "tensor_checks.h"
#include "with_grad.h"

namespace dirmult {

// One dispatch case's compute type (log_alpha's) and count type.
template <typename S, typename C>
struct Types {
  using scalar_t = S;
  using count_t = C;
};

// The typed data of one dispatch case.
template <typename S, typename C>
struct TypedArgs : Types<S, C> {
  const C* counts;
  const S* log_alpha;
  const S* grad;  // nullptr for the ops without an incoming gradient
  // An output's data (allocated in log_alpha's dtype).
  static S* out(const Tensor& t) { return static_cast<S*>(t.mutable_data_ptr()); }
};

// The CPU: no device to select; every count dtype is read in place.
struct CpuDevice {
  struct Guard {
    explicit Guard(const Tensor&) {}
  };
  static Tensor counts(const Tensor& counts) { return as_contiguous(counts); }
  template <typename Fn>
  static void dispatch(ScalarType compute, ScalarType count, Fn&& fn) {
    DM_DISPATCH_COMPUTE(compute, [&] {
      DM_DISPATCH_COUNTS(count, [&] { fn(Types<scalar_t, count_t>{}); });
    });
  }
};

namespace detail {

template <typename Device, typename Fn>
void dispatch_typed(const Tensor& counts, const Tensor& log_alpha, const Tensor* grad, Fn&& fn) {
  Device::dispatch(log_alpha.scalar_type(), counts.scalar_type(), [&](auto types) {
    using S = typename decltype(types)::scalar_t;
    using C = typename decltype(types)::count_t;
    TypedArgs<S, C> t;
    t.counts = static_cast<const C*>(counts.const_data_ptr());
    t.log_alpha = static_cast<const S*>(log_alpha.const_data_ptr());
    t.grad = grad != nullptr ? static_cast<const S*>(grad->const_data_ptr()) : nullptr;
    fn(t);
  });
}

}  // namespace detail

// log_lik and log_lik_with_grad: counts (..., V), log_alpha (V,) shared or
// counts' shape. check: check_log_alpha, or check_log_lik_with_grad.
template <typename Device>
struct LogLikArgs {
  using device_type = Device;
  bool shared;  // log_alpha (V,), shared by the rows
  typename Device::Guard guard;
  Tensor counts, log_alpha;  // contiguous
  int64_t V;
  int64_t B;  // rows, 0 when V = 0 (see num_rows)

  LogLikArgs(const Tensor& counts_, const Tensor& log_alpha_,
             bool (*check)(const Tensor&, const Tensor&) = check_log_alpha)
      : LogLikArgs(check(counts_, log_alpha_), counts_, log_alpha_) {}

  // Nothing to compute: every row's log-likelihood is 0 (V = 0), or no rows.
  bool empty() const { return B == 0; }

  template <typename Fn>
  void dispatch(Fn&& fn) const {
    detail::dispatch_typed<Device>(counts, log_alpha, nullptr, fn);
  }

 protected:
  LogLikArgs(bool shared_, const Tensor& counts_, const Tensor& log_alpha_)
      : shared(shared_),
        guard(counts_),
        counts(Device::counts(counts_)),
        log_alpha(as_contiguous(log_alpha_)),
        V(counts.size(counts.dim() - 1)),
        B(num_rows(counts)) {}
};

// log_lik_components: counts (B, V), log_alpha (K, V).
template <typename Device>
struct ComponentsArgs {
  using device_type = Device;
  int64_t K;
  typename Device::Guard guard;
  Tensor counts, log_alpha;  // contiguous
  int64_t B, V;

  ComponentsArgs(const Tensor& counts_, const Tensor& log_alpha_)
      : ComponentsArgs(check_components(counts_, log_alpha_), counts_, log_alpha_) {}

  // Nothing to compute: the (B, K) log-likelihoods (or their gradient) are 0.
  bool empty() const { return B == 0 || V == 0 || K == 0; }

  template <typename Fn>
  void dispatch(Fn&& fn) const {
    detail::dispatch_typed<Device>(counts, log_alpha, nullptr, fn);
  }

 protected:
  ComponentsArgs(int64_t K_, const Tensor& counts_, const Tensor& log_alpha_)
      : K(K_),
        guard(counts_),
        counts(Device::counts(counts_)),
        log_alpha(as_contiguous(log_alpha_)),
        B(counts.size(0)),
        V(counts.size(1)) {}
};

// A backward op's arguments: Base's (LogLikArgs, ComponentsArgs) and the
// incoming gradient, checked by check(grad, counts, log_alpha), which
// returns what Base's checks return.
template <typename Base, auto check>
struct BackwardArgs : Base {
  Tensor grad;  // contiguous

  BackwardArgs(const Tensor& grad_, const Tensor& counts_, const Tensor& log_alpha_)
      : Base(check(grad_, counts_, log_alpha_), counts_, log_alpha_), grad(as_contiguous(grad_)) {}

  template <typename Fn>
  void dispatch(Fn&& fn) const {
    detail::dispatch_typed<typename Base::device_type>(this->counts, this->log_alpha, &grad, fn);
  }
};

// log_lik_backward: one incoming gradient per row.
template <typename Device>
using LogLikBackwardArgs = BackwardArgs<LogLikArgs<Device>, check_log_lik_backward>;

// log_lik_components_backward: the incoming gradient (B, K).
template <typename Device>
using ComponentsBackwardArgs = BackwardArgs<ComponentsArgs<Device>, check_components_backward>;

// poch_terms and tpoch_terms: log_alpha and n elementwise, of one compute dtype.
template <typename Device>
struct PochTermsArgs {
  int64_t size;
  typename Device::Guard guard;
  Tensor log_alpha, n;  // contiguous

  PochTermsArgs(const Tensor& log_alpha_, const Tensor& n_, const char* op = "poch_terms")
      : size(check_poch_terms(log_alpha_, n_, op)),
        guard(log_alpha_),
        log_alpha(as_contiguous(log_alpha_)),
        n(as_contiguous(n_)) {}

  bool empty() const { return size == 0; }

  // fn(t) with t.log_alpha and t.counts (n), both of the compute type.
  template <typename Fn>
  void dispatch(Fn&& fn) const {
    DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
      TypedArgs<scalar_t, scalar_t> t;
      t.counts = static_cast<const scalar_t*>(n.const_data_ptr());
      t.log_alpha = static_cast<const scalar_t*>(log_alpha.const_data_ptr());
      t.grad = nullptr;
      fn(t);
    });
  }
};

// The typed data of one log_lik_regression dispatch case: bias and grad
// are nullptr when absent.
template <typename S, typename C>
struct RegressionTyped : Types<S, C> {
  const C* counts;
  const S* X;
  const S* W;
  const S* bias;
  const S* grad;
  static S* out(const Tensor& t) { return static_cast<S*>(t.mutable_data_ptr()); }
};

// log_lik_regression and (with grad) its backward: counts (B, V), X (B, P),
// W (P, V), bias (V,) or none, checked by check_regression(_backward).
template <typename Device>
struct RegressionArgs {
  using device_type = Device;
  bool checked;
  typename Device::Guard guard;
  Tensor counts, X, W;  // contiguous
  std::optional<Tensor> bias, grad;  // contiguous
  int64_t B, V, P;

  RegressionArgs(const Tensor& counts_, const Tensor& X_, const Tensor& W_,
                 const std::optional<Tensor>& bias_)
      : checked((check_regression(counts_, X_, W_, bias_), true)),
        guard(counts_),
        counts(Device::counts(counts_)),
        X(as_contiguous(X_)),
        W(as_contiguous(W_)),
        bias(contiguous_or_none(bias_)),
        B(counts.size(0)),
        V(counts.size(1)),
        P(X.size(1)) {}

  RegressionArgs(const Tensor& grad_, const Tensor& counts_, const Tensor& X_, const Tensor& W_,
                 const std::optional<Tensor>& bias_)
      : checked((check_regression_backward(grad_, counts_, X_, W_, bias_), true)),
        guard(counts_),
        counts(Device::counts(counts_)),
        X(as_contiguous(X_)),
        W(as_contiguous(W_)),
        bias(contiguous_or_none(bias_)),
        grad(as_contiguous(grad_)),
        B(counts.size(0)),
        V(counts.size(1)),
        P(X.size(1)) {}

  // No rows or no columns: the values (and gradients) are 0.
  bool empty() const { return B == 0 || V == 0; }

  template <typename Fn>
  void dispatch(Fn&& fn) const {
    Device::dispatch(X.scalar_type(), counts.scalar_type(), [&](auto types) {
      using S = typename decltype(types)::scalar_t;
      using C = typename decltype(types)::count_t;
      RegressionTyped<S, C> t;
      t.counts = static_cast<const C*>(counts.const_data_ptr());
      t.X = static_cast<const S*>(X.const_data_ptr());
      t.W = static_cast<const S*>(W.const_data_ptr());
      t.bias = bias.has_value() ? static_cast<const S*>(bias->const_data_ptr()) : nullptr;
      t.grad = grad.has_value() ? static_cast<const S*>(grad->const_data_ptr()) : nullptr;
      fn(t);
    });
  }

 private:
  static std::optional<Tensor> contiguous_or_none(const std::optional<Tensor>& t) {
    if (!t.has_value()) return std::nullopt;
    return as_contiguous(*t);
  }
};

// The typed data of one CSR dispatch case; the parts an op does not take
// are nullptr.
template <typename S, typename Val, typename I>
struct CsrTyped {
  using scalar_t = S;
  using value_t = Val;
  using index_t = I;
  const I* crow;
  const Val* val;
  const S* log_alpha;
  const I* col = nullptr;  // the forward's
  const S* grad = nullptr;  // the backward's, with the column-sorted copy
  const I* csc_ptr = nullptr;
  const I* csc_row = nullptr;
  const Val* csc_val = nullptr;
  static S* out(const Tensor& t) { return static_cast<S*>(t.mutable_data_ptr()); }
};

namespace detail {

template <typename T>
const T* data(const Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}

// What the CSR ops share: crow (B + 1,), values (nnz,), log_alpha (V,) or
// (K, V), checked by the derived type before this is built.
template <typename Device>
struct CsrParts {
  typename Device::Guard guard;
  Tensor crow, val, log_alpha;  // contiguous
  int64_t B, nnz, K, V;

  CsrParts(const Tensor& crow_, const Tensor& val_, const Tensor& log_alpha_)
      : guard(log_alpha_),
        crow(as_contiguous(crow_)),
        val(as_contiguous(val_)),
        log_alpha(as_contiguous(log_alpha_)),
        B(crow.numel() - 1),
        nnz(val.numel()),
        K(log_alpha.dim() == 1 ? 1 : log_alpha.size(0)),
        V(log_alpha.size(log_alpha.dim() - 1)) {}

  // fn(t) with the shared parts filled; more(t) adds the op's own first.
  template <typename More, typename Fn>
  void dispatch_parts(More&& more, Fn&& fn) const {
    DM_DISPATCH_COMPUTE(log_alpha.scalar_type(), [&] {
      DM_DISPATCH_CSR(crow.scalar_type(), val.scalar_type(), [&] {
        CsrTyped<scalar_t, value_t, index_t> t;
        t.crow = data<index_t>(crow);
        t.val = data<value_t>(val);
        t.log_alpha = data<scalar_t>(log_alpha);
        more(t);
        fn(t);
      });
    });
  }
};

}  // namespace detail

// log_lik_csr and log_lik_csr_with_grad: crow, col, val and log_alpha.
// check: check_csr_parts, or check_csr_with_grad_parts.
template <typename Device>
struct CsrArgs : detail::CsrParts<Device> {
  Tensor col;  // contiguous

  CsrArgs(const Tensor& crow_, const Tensor& col_, const Tensor& val_, const Tensor& log_alpha_,
          void (*check)(const Tensor&, const Tensor&, const Tensor&, const Tensor&) =
              check_csr_parts)
      : detail::CsrParts<Device>((check(crow_, col_, val_, log_alpha_), crow_), val_, log_alpha_),
        col(as_contiguous(col_)) {}

  template <typename Fn>
  void dispatch(Fn&& fn) const {
    this->dispatch_parts(
        [&](auto& t) { t.col = detail::data<typename std::decay_t<decltype(t)>::index_t>(col); },
        fn);
  }
};

// log_lik_csr_backward: the incoming gradient, crow, val, the column-sorted
// copy and log_alpha, checked by check_csr_backward_parts.
template <typename Device>
struct CsrBackwardArgs : detail::CsrParts<Device> {
  Tensor grad, csc_ptr, csc_row, csc_val;  // contiguous

  CsrBackwardArgs(const Tensor& grad_, const Tensor& crow_, const Tensor& val_,
                  const Tensor& csc_ptr_, const Tensor& csc_row_, const Tensor& csc_val_,
                  const Tensor& log_alpha_)
      : detail::CsrParts<Device>(
            (check_csr_backward_parts(grad_, crow_, val_, csc_ptr_, csc_row_, csc_val_,
                                      log_alpha_),
             crow_),
            val_, log_alpha_),
        grad(as_contiguous(grad_)),
        csc_ptr(as_contiguous(csc_ptr_)),
        csc_row(as_contiguous(csc_row_)),
        csc_val(as_contiguous(csc_val_)) {}

  template <typename Fn>
  void dispatch(Fn&& fn) const {
    this->dispatch_parts(
        [&](auto& t) {
          using T = std::decay_t<decltype(t)>;
          t.grad = detail::data<typename T::scalar_t>(grad);
          t.csc_ptr = detail::data<typename T::index_t>(csc_ptr);
          t.csc_row = detail::data<typename T::index_t>(csc_row);
          t.csc_val = detail::data<typename T::value_t>(csc_val);
        },
        fn);
  }
};

}  // namespace dirmult
