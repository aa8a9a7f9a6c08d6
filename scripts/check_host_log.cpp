// host_log_normal (include/dirmult/host_log.h) against log in double rounded
// to float, over every float in [1, FLT_MAX] (or a stride of them):
// mismatches, and the largest error in float ulps of the double reference.
//   g++ -O2 -std=c++17 -ffp-contract=off -Iinclude scripts/check_host_log.cpp -o /tmp/chk && /tmp/chk [stride]
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dirmult/host_log.h"

int main(int argc, char** argv) {
  const unsigned stride = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 1;
  const unsigned first = 0x3f800000u, last = 0x7f7fffffu;  // 1 .. FLT_MAX
  unsigned long long n = 0, mismatches = 0;
  double worst = 0.0;
  float worst_x = 1.0f;
  for (unsigned b = first; b <= last && b >= first; b += stride) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    const float got = dirmult::host_log_normal(x);
    const double ref = std::log(static_cast<double>(x));
    ++n;
    if (got != static_cast<float>(ref)) ++mismatches;
    if (ref == 0.0) {
      if (got != 0.0f) worst = 1e9;
      continue;
    }
    int e;
    std::frexp(ref, &e);
    const double ulp = std::ldexp(1.0, e - 24);
    const double err = std::fabs(static_cast<double>(got) - ref) / ulp;
    if (err > worst) worst = err, worst_x = x;
  }
  std::printf("%llu floats, %llu differ from log rounded to float (%.3g%%), max error %.4f ulp at %a\n",
              n, mismatches, 100.0 * mismatches / n, worst, worst_x);
  return worst < 0.6 ? 0 : 1;
}
