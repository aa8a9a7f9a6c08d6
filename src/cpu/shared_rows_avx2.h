// The shared-alpha math path (rows without a lookup table: fewer than
// kTableMinRows of them, or sparse ones) eight counts at a time with AVX2,
// chosen at run time. The scalar path's product loop mispredicts its exit
// and zero test on random counts, which leaves a few dense rows slower than
// eager (docs/PERFORMANCE_LEDGER.md, CPU). Here the exact products run in vector
// registers to the eight counts' largest and their logs are
// host_log_normal's in AVX2 lanes: every term is the scalar path's bits, so
// a row's value does not depend on which path, or how many rows, it took
// (See Note [Batch invariance]).
#pragma once

#include <cstdint>

#include "dirmult/math.h"

namespace dirmult {
namespace cpu {

// Whether this CPU runs shared_lnpoch8_avx2 (AVX2).
bool shared_rows_avx2_available();

// For the counts n[0..8) (as float; NaN marks a count left to the caller)
// of eight columns with concentrations a[0..8) and log-concentrations
// la[0..8): writes lnpoch(a, n) to term[j] for the counts that are integers
// 1..16 and do not cancel (math.h lnpoch_exact_checked without its float64
// redo), the bits math.h's lnpoch gives on the host, and +0 to the lanes
// whose count is not an integer 1..16 (zeros among them). Returns the
// lanes of those terms in done; nonzero: the lanes whose count is not 0
// (the caller takes the nonzero lanes that are not done by the scalar
// path). Only when shared_rows_avx2_available().
void shared_lnpoch8_avx2(const float* a, const float* la, const float* n, float* term,
                         unsigned& nonzero, unsigned& done);

// The gradient's math path the same way: for the counts n[0..8) of eight
// columns with concentrations a[0..8), writes a dpoch(a, n) (math.h
// adpoch_exact, the scalar path's bits) to term[j] for the counts that are
// integers 1..16 and +0 to the other lanes. done and nonzero as for
// shared_lnpoch8_avx2 (no term of this path is redone). Only when
// shared_rows_avx2_available().
void shared_adpoch8_avx2(const float* a, const float* n, float* term, unsigned& nonzero,
                         unsigned& done);

// The lookup-table entries 1 .. top of eight columns with concentrations
// a[0..8) and log-concentrations la[0..8), in one run of running products
// (SharedAlpha::table's, math.h exact_run_step): entry[n][j] for column j
// is lnpoch(a, n) - log_fact[n] (log_poch) or a dpoch(a, n), the bits of
// the scalar build, except the lnpoch entries that cancel, left to the
// caller's float64 redo: lane j of redo[n]. Entries past top are not
// written. Only when shared_rows_avx2_available().
void shared_table8_avx2(const float* a, const float* la, int top, bool log_poch,
                        const float* log_fact, float (*entry)[8], uint8_t* redo);

// alpha[v] = dm_exp(la[v]) and factors[v] = exact_factors(alpha[v], 1 /
// alpha[v]) for v < n, eight columns at a time (host_exp in AVX2 lanes):
// the scalar loop's bits. Only when shared_rows_avx2_available().
void shared_alpha_avx2(const float* la, int64_t n, float* alpha, ExactFactors<float>* factors);

}  // namespace cpu
}  // namespace dirmult
