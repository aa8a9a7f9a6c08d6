// DM_BOX(fn): TORCH_BOX, except that when fn throws, the argument tensors
// are left alive instead of released. The boxed kernel owns its argument
// handles, and whether the caller also releases them after a kernel throws
// differs between torch releases: a few handles leaked on an error path are
// harmless, a double free would not be. See Note [Stable ABI errors].
#pragma once

#include <torch/csrc/stable/library.h>

#include <tuple>
#include <type_traits>

namespace dirmult {

template <typename T>
struct is_std_tuple : std::false_type {};
template <typename... T>
struct is_std_tuple<std::tuple<T...>> : std::true_type {};

template <typename FuncT, FuncT* func>
struct SafeBoxer;

template <typename R, typename... Args, R (*func)(Args...)>
struct SafeBoxer<R(Args...), func> {
  static void boxed_fn(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    namespace sd = torch::stable::detail;
    using ArgTuple = std::tuple<sd::unbox_type_t<Args>...>;
    // Deleted only on success: if func throws, the handles stay owned.
    auto* args = new ArgTuple(sd::unbox_to_tuple<sd::unbox_type_t<Args>...>(stack));
    R result = std::apply(func, *args);
    delete args;
    if constexpr (is_std_tuple<R>::value) {
      std::apply([&](auto&&... r) { box_each(stack, r...); }, result);
    } else {
      stack[0] = sd::from(result);
    }
  }

 private:
  template <typename... T>
  static void box_each(StableIValue* stack, const T&... values) {
    int i = 0;
    ((stack[i++] = torch::stable::detail::from(values)), ...);
  }
};

}  // namespace dirmult

#define DM_BOX(func) ::dirmult::SafeBoxer<std::remove_pointer_t<decltype(func)>, func>::boxed_fn
