// Per-sample float32 forward terms eight at a time, with AVX2 and FMA (x86-64
// CPUs that have them, chosen at run time; the package itself is built for
// the baseline ISA). The scalar path spends one expf, a loop of products
// with a data-dependent trip count and a logf on each count, slower than
// eager float32 PyTorch's vectorized formula (docs/PERFORMANCE_LEDGER.md, CPU). Here the
// same exact products run in vector registers to the block's largest count,
// with one vector exp and log per eight counts.
#pragma once

#include <cstdint>

namespace dirmult {
namespace cpu {

// Elements per per_sample_block_avx2 call.
constexpr int kPerSampleBlock = 256;

// A row piece's sums from per_sample_block_avx2 calls.
struct PerSampleBlockSums {
  double s = 0.0;     // lnpoch terms that do not cancel
  double norm = 0.0;  // log n! of the counts 0..16 (normalize)
  double A = 0.0;     // concentrations, every element
  int64_t N = 0;      // the counts 0..16
  bool finite = true;  // every log_alpha finite
  double magnitude = 0.0;  // sum of |s's terms|
  // The last block's cancelling terms: the sum of their float32 values and
  // a bound on its error, in units of 2^-24.
  double cancel_s = 0.0;
  float cancel_err = 0.0f;
};

// Whether this CPU runs per_sample_block_avx2 (AVX2 and FMA).
bool per_sample_avx2_available();

// For la[0..m) and counts n[0..m) as float (m <= kPerSampleBlock; NaN marks a
// count the caller takes itself): adds every exp(la) to A; for the counts
// that are integers 0..16, n to N and, when normalize, log n! to norm, and
// lnpoch(a, n) to s where it does not cancel (math.h lnpoch_exact_cancels;
// |lnpoch| to magnitude), else to cancel_s (with cancel_err), their
// positions written to cancelling (num_cancelling of them): the caller keeps
// cancel_s or redoes those terms in float64. Writes the positions of the
// other elements (counts off the table or bad) to rest and returns how
// many: the caller gives them the scalar path (all but A). Only when
// per_sample_avx2_available().
int per_sample_block_avx2(const float* la, const float* n, int m, bool normalize,
                          PerSampleBlockSums& sums, uint16_t* rest, uint16_t* cancelling,
                          int& num_cancelling);

// The per-sample gradient with respect to log_alpha of one row's elements
// [0, m) (m <= kPerSampleBlock): out[i] = g (adpoch(a_i, n_i) - a_i d) for
// the counts that are integers 0..16 (d = dpoch(A, N) of the row). Writes
// the positions of the others (off the table or bad; out[i] unwritten) to
// rest and returns how many. Only when per_sample_avx2_available().
int per_sample_grad_block_avx2(const float* la, const float* n, int m, double g, double d,
                               float* out, uint16_t* rest);

// The sum of exp(la[i]), i < m, in double; finite is cleared if a log_alpha
// is not finite. Only when per_sample_avx2_available().
double per_sample_alpha_sum_avx2(const float* la, int64_t m, bool& finite);

}  // namespace cpu
}  // namespace dirmult
