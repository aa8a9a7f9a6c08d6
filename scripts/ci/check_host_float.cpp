// host_log_normal and host_exp (include/dirmult/host_float.h) against log
// and exp in double rounded to float: the log over every float in [1,
// FLT_MAX], the exp over every float in [-104, 89] and a few past it (or a
// stride of them); mismatches, and the largest error in float ulps of the
// double reference (subnormal results: in ulps of the smallest normal's
// exponent range, i.e. absolute 2^-149 units).
//   g++ -O2 -std=c++17 -ffp-contract=off -Iinclude scripts/ci/check_host_float.cpp -o /tmp/chk && /tmp/chk [stride]
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "dirmult/host_float.h"

namespace {

struct Tally {
  unsigned long long n = 0, mismatches = 0;
  double worst = 0.0;
  float worst_x = 0.0f;

  void add(float x, float got, double ref) {
    ++n;
    if (got != static_cast<float>(ref) &&
        !(std::isnan(got) && std::isnan(ref))) {
      ++mismatches;
    }
    const float rf = static_cast<float>(ref);
    if (std::isinf(rf) || std::isnan(rf) || rf == 0.0f) {  // (overflow, NaN, underflow)
      if (got != static_cast<float>(ref) && !(std::isnan(got) && std::isnan(ref))) worst = 1e9;
      return;
    }
    int e;
    std::frexp(ref, &e);
    const double ulp = std::ldexp(1.0, std::max(e, -125) - 24);
    const double err = std::fabs(static_cast<double>(got) - ref) / ulp;
    if (err > worst) worst = err, worst_x = x;
  }
  void print(const char* what) const {
    std::printf("%s: %llu floats, %llu differ from the double result rounded to float (%.3g%%), "
                "max error %.4f ulp at %a\n",
                what, n, mismatches, 100.0 * mismatches / n, worst, worst_x);
  }
};

float as_float(unsigned b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned stride = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 1;
  Tally log_t, exp_t;
  for (unsigned b = 0x3f800000u; b <= 0x7f7fffffu && b >= 0x3f800000u; b += stride) {
    const float x = as_float(b);
    log_t.add(x, dirmult::host_log_normal(x), std::log(static_cast<double>(x)));
  }
  // [0, 89] and [-104, -0] by their bit patterns.
  for (unsigned b = 0; b <= 0x42b20000u; b += stride) {
    const float x = as_float(b);
    exp_t.add(x, dirmult::host_exp(x), std::exp(static_cast<double>(x)));
  }
  for (unsigned b = 0x80000000u; b <= 0xc2d00000u && b >= 0x80000000u; b += stride) {
    const float x = as_float(b);
    exp_t.add(x, dirmult::host_exp(x), std::exp(static_cast<double>(x)));
  }
  for (const float x : {-INFINITY, -1e30f, -104.5f, -200.0f, 89.5f, 1e30f, INFINITY, NAN}) {
    exp_t.add(x, dirmult::host_exp(x), std::exp(static_cast<double>(x)));
  }
  log_t.print("host_log_normal");
  exp_t.print("host_exp");
  return log_t.worst < 0.6 && exp_t.worst < 0.6 ? 0 : 1;
}
