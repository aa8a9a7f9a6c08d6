// Scratch memory of the launchers: one allocation from torch's caching
// allocator per call, carved into aligned regions.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

namespace dirmult {
namespace cuda {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

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

}  // namespace cuda
}  // namespace dirmult
