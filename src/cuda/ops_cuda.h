// Host-side pieces shared by the CUDA op implementations.
#pragma once

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
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
