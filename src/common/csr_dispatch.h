// Dispatch over the CSR parts' dtypes: index_t (crow and col indices, int32
// or int64) and value_t (the values, float32 or float64; other count dtypes
// are converted once in Python, python/dirmult_ext/likelihood/sparse.py).
#pragma once

#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>

#define DM_CSR_INDEX_CASE(ENUM, TYPE, ...)    \
  case torch::headeronly::ScalarType::ENUM: { \
    using index_t = TYPE;                     \
    __VA_ARGS__();                            \
    break;                                    \
  }
#define DM_CSR_VALUE_CASE(ENUM, TYPE, ...)    \
  case torch::headeronly::ScalarType::ENUM: { \
    using value_t = TYPE;                     \
    __VA_ARGS__();                            \
    break;                                    \
  }
#define DM_CSR_DISPATCH_VALUES(VALUE, ...)                                  \
  switch (VALUE) {                                                          \
    DM_CSR_VALUE_CASE(Float, float, __VA_ARGS__)                            \
    DM_CSR_VALUE_CASE(Double, double, __VA_ARGS__)                          \
    default:                                                                \
      STD_TORCH_CHECK(false, "dirmult: values must be float32 or float64"); \
  }
#define DM_DISPATCH_CSR(INDEX, VALUE, ...)                                                \
  switch (INDEX) {                                                                        \
    DM_CSR_INDEX_CASE(Int, int32_t, [&] { DM_CSR_DISPATCH_VALUES(VALUE, __VA_ARGS__); }) \
    DM_CSR_INDEX_CASE(Long, int64_t, [&] { DM_CSR_DISPATCH_VALUES(VALUE, __VA_ARGS__); })\
    default:                                                                              \
      STD_TORCH_CHECK(false, "dirmult: CSR indices must be int32 or int64");              \
  }
