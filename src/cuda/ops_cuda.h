// Host-side pieces shared by the CUDA op implementations.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "../common/count_dispatch.h"
#include "../common/tensor_checks.h"

namespace dirmult {
namespace cuda {

using torch::headeronly::ScalarType;

template <typename T>
bool is_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Row k of a (K, ...) tensor, a view (torch::stable::narrow takes a
// non-const handle, hence the copy of the handle).
inline Tensor row_view(Tensor t, int64_t k) { return torch::stable::narrow(t, 0, k, 1); }

// Which way float32 log_lik_components and its backward take on CUDA:
// DIRMULT_CUDA_COMPONENTS=fused or =per_component forces one (so tests reach
// both ways at any shape, and scripts/tuning/components_crossover.py can time the
// fused way to refit the rule on another GPU without an edited build);
// unset, empty or auto: the measured rule (components_as_shared_forward /
// _backward). Read once per process; the Python package checks the value
// on import (the clearer error on torch builds that crash on C++ errors).
enum class ComponentsWay { kByRule, kFused, kPerComponent };

inline ComponentsWay components_way_setting() {
  static const ComponentsWay way = [] {
    const char* e = std::getenv("DIRMULT_CUDA_COMPONENTS");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "auto") == 0) return ComponentsWay::kByRule;
    if (std::strcmp(e, "fused") == 0) return ComponentsWay::kFused;
    STD_TORCH_CHECK(std::strcmp(e, "per_component") == 0,
                    "dirmult: DIRMULT_CUDA_COMPONENTS must be auto, fused or per_component, got '",
                    e, "'");
    return ComponentsWay::kPerComponent;
  }();
  return way;
}

// Whether to run log_lik's kernels once per component, given the rule's pick.
inline bool components_per_component(bool rule_picks_it) {
  switch (components_way_setting()) {
    case ComponentsWay::kFused:
      return false;
    case ComponentsWay::kPerComponent:
      return true;
    default:
      return rule_picks_it;
  }
}

// Scratch memory from torch's caching allocator (safe in CUDA graph capture).
inline Tensor workspace(const Tensor& like, int64_t bytes) {
  return torch::stable::new_empty(like, {std::max<int64_t>(bytes, 1)}, ScalarType::Byte);
}

// One scratch allocation carved into regions, each 16-byte aligned (enough
// for double2 / float4 access):
//   ScratchLayout l; const int64_t a = l.add(bytes_a), b = l.add(bytes_b);
//   Tensor ws = workspace(like, l.size()); l.at<double>(ws, a) ...
class ScratchLayout {
 public:
  int64_t add(int64_t bytes) {
    const int64_t at = size_;
    size_ += (std::max<int64_t>(bytes, 0) + 15) / 16 * 16;
    return at;
  }
  int64_t size() const { return size_; }
  template <typename T>
  static T* at(const Tensor& ws, int64_t offset) {
    return reinterpret_cast<T*>(static_cast<char*>(ws.mutable_data_ptr()) + offset);
  }

 private:
  int64_t size_ = 0;
};

// Contiguous counts in a dtype the kernels read natively (see
// DM_DISPATCH_NATIVE_COUNTS).
inline Tensor native_counts(const Tensor& counts) {
  switch (counts.scalar_type()) {
    case ScalarType::Int:
    case ScalarType::Long:
      return as_contiguous(torch::stable::to(counts, ScalarType::Double));
    case ScalarType::Half:
    case ScalarType::BFloat16:
      return as_contiguous(torch::stable::to(counts, ScalarType::Float));
    default:
      return as_contiguous(counts);
  }
}

Tensor log_lik_cuda(Tensor counts, Tensor log_alpha, bool normalize);
std::tuple<Tensor, Tensor> log_lik_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha,
                                                 bool normalize, bool counts_grad);
Tensor log_lik_components_cuda(Tensor counts, Tensor log_alpha, bool normalize);
Tensor log_lik_components_backward_cuda(Tensor grad, Tensor counts, Tensor log_alpha);
std::tuple<Tensor, Tensor> log_lik_with_grad_cuda(Tensor counts, Tensor log_alpha, bool normalize);

}  // namespace cuda
}  // namespace dirmult
