"""The CPU per-sample float32 forward, which on x86-64 CPUs with AVX2 and
FMA takes eight counts at a time in blocks of 256 (src/cpu/per_sample_avx2.h)
and leaves counts off the table and bad ones to the scalar path, and
cancelling terms too where the row's magnitudes cannot absorb their float32
error: block and vector edges, every count dtype, concentrations from tiny
(below exp's vector range) to scaled, the cancellation band, bad values."""
import pytest
import torch

import dirmult_ext

from reference import cancelling_rows, log_lik_float64, magnitudes


def mixed_counts(B, V, dtype):
    """Counts 0..16 (the table), some off it (large; fractional for float
    dtypes), a third zeros."""
    c = torch.randint(0, 17, (B, V)).double() * (torch.rand(B, V) > 0.33)
    big = torch.rand(B, V) < 0.03
    c[big] = torch.randint(17, 200, (int(big.sum()),)).double()
    if dtype.is_floating_point:
        frac = torch.rand(B, V) < 0.03
        c[frac] = torch.rand(int(frac.sum())).double() * 20
    else:
        c.clamp_(max=255)
    return c.to(dtype)


@pytest.mark.parametrize("V", [1, 7, 8, 9, 255, 256, 257, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8])
@pytest.mark.parametrize("normalize", [False, True])
def test_per_sample_blocks_match_float64(V, dtype, normalize):
    B = 5
    counts = mixed_counts(B, V, dtype)
    la = torch.empty(B, V).uniform_(-3.0, 4.0)
    la[:, ::5] = torch.empty(la[:, ::5].shape).uniform_(-2.5, 0.0)  # cancellation band
    la[:, 1::7] = torch.empty(la[:, 1::7].shape).uniform_(2.1, 15.0)  # scaled factors
    out = dirmult_ext.log_lik(counts, la, normalize=normalize)
    ref = log_lik_float64(counts, la, normalize)
    rows, _ = magnitudes(counts, la, normalize)
    assert ((out.double() - ref).abs() / rows.clamp_min(1.0)).max() < 2e-6


@pytest.mark.parametrize("V", [2000, 20])
@pytest.mark.parametrize("normalize", [False, True])
def test_per_sample_cancelling_terms_match_float64(V, normalize):
    # Long rows (2000: eight blocks) keep their cancelling terms' float32
    # values, whose error bound (2^-22 of the row's magnitudes) the large
    # terms absorb; short ones (20) redo them in float64. Off by 1e-3 in
    # either kind of value, the rows fail.
    counts, la = cancelling_rows(16, V, with_large_terms=V > 20)
    out = dirmult_ext.log_lik(counts, la, normalize=normalize)
    ref = log_lik_float64(counts, la, normalize)
    rows, _ = magnitudes(counts, la, normalize)
    assert ((out.double() - ref).abs() / rows).max() < 4e-7


def test_per_sample_tiny_concentrations_match_float64():
    # exp(log_alpha) below float32's normal range (denormal) is taken by the
    # scalar exp, as in the scalar path. The terms are lnpoch at the float32
    # log_alpha inputs (log a is the input, not the log of the rounded
    # denormal a, which differs by up to ~0.1 per term); A sums the float32
    # concentrations (a row of only denormal alphas has an A that float32
    # rounds by up to 0.1%, and lnpoch(A, N) with it). The reference is
    # float64 of exactly that. (Taking every term at log of the float32 a
    # failed ~3% of draws: 0.08 off in a row of magnitude 34000.)
    B, V = 4, 300
    counts = mixed_counts(B, V, torch.float32)
    la = torch.empty(B, V).uniform_(-3.0, 4.0)
    la[0] = torch.empty(V).uniform_(-100.0, -87.5)  # every alpha denormal or 0
    la[1, ::3] = -95.0
    out = dirmult_ext.log_lik(counts, la)
    n, a = counts.double(), la.double().exp()
    A, N = la.exp().double().sum(-1), n.sum(-1)
    ref = (torch.lgamma(n + a) - torch.lgamma(a)).sum(-1) + torch.lgamma(A) - torch.lgamma(A + N)
    rows, _ = magnitudes(counts, la)
    assert ((out.double() - ref).abs() / rows.clamp_min(1.0)).max() < 2e-6


def test_per_sample_bad_values_give_nan_rows():
    counts = mixed_counts(8, 600, torch.float32)
    la = torch.empty(8, 600).uniform_(-3.0, 4.0)
    counts[0, 300] = float("nan")
    counts[1, 7] = -1.0
    counts[2, 599] = float("inf")
    la[3, 256] = float("inf")
    la[4, 0] = float("-inf")
    la[5, 511] = float("nan")
    out = torch.ops.dirmult.log_lik(counts, la, False)
    assert torch.isnan(out[:6]).all() and not torch.isnan(out[6:]).any()
    ref = log_lik_float64(counts[6:], la[6:])
    rows, _ = magnitudes(counts[6:], la[6:])
    assert ((out[6:].double() - ref).abs() / rows.clamp_min(1.0)).max() < 2e-6


def test_per_sample_rows_split_into_chunks_match_whole_rows():
    # Few long rows are split into column chunks (for_each_row); each chunk
    # is its own run of blocks.
    B, V = 2, 70001
    counts = mixed_counts(B, V, torch.float32)
    la = torch.empty(B, V).uniform_(-3.0, 4.0)
    out = dirmult_ext.log_lik(counts, la, normalize=True)
    ref = log_lik_float64(counts, la, True)
    rows, _ = magnitudes(counts, la, True)
    assert ((out.double() - ref).abs() / rows.clamp_min(1.0)).max() < 2e-6


@pytest.mark.parametrize("V", [1, 9, 256, 257, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8])
def test_per_sample_gradient_matches_float64(V, dtype):
    # The gradient with respect to log_alpha (per_sample_grad_block_avx2 and
    # the row totals' alpha sum), weighted rows, every count kind.
    B = 6
    counts = mixed_counts(B, V, dtype)
    la = torch.empty(B, V).uniform_(-3.0, 4.0)
    la[:, 1::7] = torch.empty(la[:, 1::7].shape).uniform_(2.1, 15.0)
    w = torch.randn(B)
    la32 = la.clone().requires_grad_()
    g, = torch.autograd.grad((dirmult_ext.log_lik(counts, la32) * w).sum(), la32)
    la64 = la.double().requires_grad_()
    g_ref, = torch.autograd.grad((log_lik_float64(counts, la64) * w.double()).sum(), la64)
    # Each element relative to its own terms: |w_b| (|a dpoch(a, n)| + a |dpoch(A, N)|).
    a = la.double().exp()
    n = counts.double()
    A, N = a.sum(1, keepdim=True), n.sum(1, keepdim=True)
    scale = w.double().abs().unsqueeze(1) * (
        (a * (torch.digamma(n + a) - torch.digamma(a))).abs()
        + a * (torch.digamma(N + A) - torch.digamma(A)).abs())
    assert ((g.double() - g_ref).abs() / scale.clamp_min(1.0)).max() < 1e-5


def test_per_sample_gradient_bad_count_gives_nan_row():
    counts = mixed_counts(3, 300, torch.float32)
    counts[1, 290] = -2.0
    la = torch.empty(3, 300).uniform_(-3.0, 4.0).requires_grad_()
    g, = torch.autograd.grad(torch.ops.dirmult.log_lik(counts, la, False).sum(), la)
    assert torch.isnan(g[1]).all() and not torch.isnan(g[[0, 2]]).any()
