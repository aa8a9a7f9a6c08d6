// Dispatch over the count dtypes the kernels read natively (no conversion
// pass: integers and half types are converted in registers).
#pragma once

#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Exception.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>

#define DM_COUNT_CASE(ENUM, TYPE, ...)    \
  case torch::headeronly::ScalarType::ENUM: { \
    using count_t = TYPE;                 \
    __VA_ARGS__();                        \
    break;                                \
  }

#define DM_DISPATCH_COUNTS(DTYPE, ...)                                     \
  switch (DTYPE) {                                                         \
    DM_COUNT_CASE(Float, float, __VA_ARGS__)                               \
    DM_COUNT_CASE(Double, double, __VA_ARGS__)                             \
    DM_COUNT_CASE(Half, c10::Half, __VA_ARGS__)                            \
    DM_COUNT_CASE(BFloat16, c10::BFloat16, __VA_ARGS__)                    \
    DM_COUNT_CASE(Int, int32_t, __VA_ARGS__)                               \
    DM_COUNT_CASE(Long, int64_t, __VA_ARGS__)                              \
    DM_COUNT_CASE(Byte, uint8_t, __VA_ARGS__)                              \
    default:                                                               \
      STD_TORCH_CHECK(false, "dirmult: unsupported counts dtype");         \
  }

// X(count_t) for each count type of DM_DISPATCH_COUNTS (the same list), for
// explicit instantiations of kernels defined in one file and called from
// others.
#define DM_FOR_EACH_COUNT_TYPE(X) \
  X(float) X(double) X(c10::Half) X(c10::BFloat16) X(int32_t) X(int64_t) X(uint8_t)

#define DM_DISPATCH_COMPUTE(DTYPE, ...)                                    \
  switch (DTYPE) {                                                         \
    case torch::headeronly::ScalarType::Float: {                           \
      using scalar_t = float;                                              \
      __VA_ARGS__();                                                       \
      break;                                                               \
    }                                                                      \
    case torch::headeronly::ScalarType::Double: {                          \
      using scalar_t = double;                                             \
      __VA_ARGS__();                                                       \
      break;                                                               \
    }                                                                      \
    default:                                                               \
      STD_TORCH_CHECK(false, "dirmult: log_alpha must be float32/float64"); \
  }

// The CUDA kernels read float32, float64 and uint8 counts natively; the
// other count dtypes are converted first (integers to float64, so totals
// above 2^24 stay exact; half types to float32). Fewer kernel instances keep
// the build time and the wheel size down.
#define DM_DISPATCH_NATIVE_COUNTS(DTYPE, ...)                                \
  switch (DTYPE) {                                                         \
    DM_COUNT_CASE(Float, float, __VA_ARGS__)                               \
    DM_COUNT_CASE(Double, double, __VA_ARGS__)                             \
    DM_COUNT_CASE(Byte, uint8_t, __VA_ARGS__)                              \
    default:                                                               \
      STD_TORCH_CHECK(false, "dirmult: counts dtype was not converted");   \
  }
