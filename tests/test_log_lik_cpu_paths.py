"""The CPU kernels' own paths for log_lik: the few-row tables, the AVX2 math
path and its switch, thread-count independence, table entries against the
direct values, and the per-sample float32 forward and gradient, which on
x86-64 CPUs with AVX2 and FMA take eight counts at a time in blocks of 256
(src/cpu/per_sample_avx2.h) and leave counts off the table and bad ones to
the scalar path, and cancelling terms too where the row's magnitudes cannot
absorb their float32 error: block and vector edges, every count dtype,
concentrations from tiny (below exp's vector range) to scaled, the
cancellation band, bad values."""
import os
import subprocess
import sys

import pytest
import torch

import dirmult_ext

from reference import cancelling_rows, log_lik_float64, magnitudes, tolerance


# CPU, few rows (6 to 63): plan_table builds a table only where its entries
# cost less than the nonzero counts would by the math path, and only up to
# each column's largest count. Dense rows take such a table, sparse ones the
# math path. A row's value is the same bits whether another row raises some
# columns' largest counts to 16 (the same path), and, in float32 without
# normalize, whichever path the rows take (full tables from 64 rows; alone,
# the math path). Across paths, normalized float32 differs within a rounding
# of a term (a normalized entry is lnpoch - log n! rounded once, as in
# test_cpu_table_entries_are_the_direct_values: 1 ulp of the row in ~2% of
# sparse draws), and float64 within roundings of the row's terms (the paths
# sum in different orders). The gradient's tables are cut the same way. A
# non-integer count (its column's top rounds down) and one off the table.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("density", [1.0, 0.05])
def test_cpu_few_row_tables_keep_each_rows_bits(dtype, normalize, density):
    B, V = 16, 3000
    counts = (torch.randint(0, 5, (B, V)) * (torch.rand(B, V) < density)).to(dtype)
    counts[1, 7], counts[2, 9] = 2.5, 40.0
    la = torch.empty(V, dtype=dtype).uniform_(-2.5, 3.0)
    few = dirmult_ext.log_lik(counts, la, normalize=normalize)
    raised = torch.cat([counts, torch.zeros(1, V, dtype=dtype)])
    raised[B, :300] = 16
    assert torch.equal(few, dirmult_ext.log_lik(raised, la, normalize=normalize)[:B])
    many = dirmult_ext.log_lik(counts.repeat(5, 1), la, normalize=normalize)[:B]
    alone = torch.cat([dirmult_ext.log_lik(counts[i:i + 1], la, normalize=normalize)
                       for i in range(B)])
    rows, cols = magnitudes(counts, la, normalize)
    for other in (many, alone):
        if dtype == torch.float32 and not normalize:
            assert torch.equal(few, other)
        else:  # within a few roundings of the row's terms
            diff = (few.double() - other.double()).abs()
            assert (diff <= 16 * torch.finfo(dtype).eps * rows).all()  # (seen: 2.9)
    ref = log_lik_float64(counts, la, normalize)
    assert ((few.double() - ref).abs() / rows.clamp_min(1.0)).max() < tolerance(dtype)
    lg = la.clone().requires_grad_()
    w = torch.rand(B, dtype=dtype)  # (weighted: the backward's tables)
    for weights in (None, w):
        out = dirmult_ext.log_lik(counts, lg, normalize=normalize)
        g, = torch.autograd.grad(out.sum() if weights is None else (out * weights).sum(), lg)
        l64 = la.double().requires_grad_()
        o64 = log_lik_float64(counts, l64, normalize)
        g64, = torch.autograd.grad(o64.sum() if weights is None else (o64 * weights.double()).sum(), l64)
        assert ((g.double() - g64).abs() / cols.clamp_min(1.0)).max() < 10 * tolerance(dtype)


# CPU: rows without a table (fewer than six, or sparse) take the math path
# eight counts at a time with AVX2 where the CPU has it (shared_rows_avx2.cpp:
# the exact products and host_log_normal in vector lanes; the scalar path
# for counts off 1..16, cancelling terms and the columns past the last
# eight). Its terms are the scalar path's bits, so a row alone equals the
# same row in a batch of 70 (full tables, built by the scalar path), in
# float32 without normalize; every count dtype; concentrations on both
# sides of kStirlingMin and in the cancellation band; a column count that
# leaves a scalar tail.
@pytest.mark.parametrize("count_dtype", [torch.float32, torch.int64, torch.uint8, torch.int32])
def test_cpu_vector_math_path_keeps_each_rows_bits(count_dtype):
    B, V = 70, 4099
    counts = torch.randint(0, 17, (B, V)) * (torch.rand(B, V) < 0.8)
    la = torch.empty(V).uniform_(-3.0, 3.5)
    if count_dtype.is_floating_point:
        counts = counts.to(count_dtype)
        counts[0, 5], counts[1, 9], counts[2, 100] = 2.5, 40.0, 1e6
    counts = counts.to(count_dtype)
    batch = dirmult_ext.log_lik(counts, la)
    alone = torch.cat([dirmult_ext.log_lik(counts[i:i + 1], la) for i in range(5)])
    assert torch.equal(batch[:5], alone)
    few = dirmult_ext.log_lik(counts[:5], la)
    assert torch.equal(few, alone)
    rows, _ = magnitudes(counts[:5], la)
    ref = log_lik_float64(counts[:5], la)
    assert ((alone.double() - ref).abs() / rows.clamp_min(1.0)).max() < tolerance(torch.float32)


# CPU: the same bits whatever the thread count. The columns' exps and A's
# partial sums run in parallel over fixed blocks of columns (A's parts added
# in order), the rows over threads: one thread and two give the same values
# and gradients, for one row (the columns split) and for many (tables). In
# float64 the outputs carry A's last bits.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B", [1, 70])
def test_cpu_results_do_not_depend_on_the_thread_count(B, dtype):
    V = 3 * 4096 + 5
    counts = (torch.randint(0, 17, (B, V)) * (torch.rand(B, V) < 0.5)).to(dtype)
    la = torch.empty(V, dtype=dtype).uniform_(-3.0, 3.5)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            lg = la.clone().requires_grad_()
            out = dirmult_ext.log_lik(counts, lg, normalize=True)
            g, = torch.autograd.grad(out.sum(), lg)
            results.append((out.detach(), g))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


# The same rows with the AVX2 kernels turned off (DIRMULT_CPU_SIMD=none, in a
# process of its own): the scalar math path (4 rows) and the scalar tables'
# build (70 rows: lnpoch for the forward, alpha dpoch for the weighted
# backward, both for the single pass of the sum), the same bits, normalized
# too. 4101 columns: the vector build's blocks of eight and a scalar rest.
def _simd_switch_results(counts, la, w):
    out = []
    for normalize in (False, True):
        lg = la.clone().requires_grad_()
        o = dirmult_ext.log_lik(counts, lg, normalize=normalize)
        g, = torch.autograd.grad((o * w).sum(), lg)
        lg = la.clone().requires_grad_()
        s, = torch.autograd.grad(dirmult_ext.log_lik(counts, lg, normalize=normalize).sum(), lg)
        out += [o.detach(), g, s]
    return out


# (4, 4101): the math path in rows (forward and gradient); (3, 20000): few
# long rows, the gradient by column chunks; (70, 4101): the tables; uint8:
# counts converted for the vector lanes.
@pytest.mark.parametrize("B, V, dtype", [(4, 4101, torch.float32), (70, 4101, torch.float32),
                                         (3, 20000, torch.float32), (3, 20000, torch.uint8)])
def test_cpu_simd_switch_keeps_the_bits(tmp_path, B, V, dtype):
    counts = torch.randint(0, 17, (B, V)) * (torch.rand(B, V) < 0.8)
    counts = counts.float()
    counts[0, 5], counts[1, 9] = 2.5, 40.0
    counts = counts.to(dtype)
    la = torch.empty(V).uniform_(-3.0, 3.5)
    w = torch.rand(B)
    torch.save({"counts": counts, "la": la, "w": w}, tmp_path / "in.pt")
    code = (
        "import sys, torch, dirmult_ext\n"
        "sys.path.insert(0, sys.argv[3])\n"
        "from test_log_lik_cpu_paths import _simd_switch_results\n"
        "d = torch.load(sys.argv[1])\n"
        "info = dirmult_ext.build_info()\n"
        "assert info['cpu_simd'] == 'none', info\n"
        "torch.save(_simd_switch_results(d['counts'], d['la'], d['w']), sys.argv[2])\n")
    env = dict(os.environ, DIRMULT_CPU_SIMD="none")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"),
                    os.path.dirname(os.path.abspath(__file__))], env=env, check=True)
    scalar = torch.load(tmp_path / "out.pt")
    for mine, other in zip(_simd_switch_results(counts, la, w), scalar):
        assert torch.equal(mine, other)


# CPU: a lookup-table entry (one run of running products per column) is the
# bits of the direct evaluation of lnpoch: with one column a row's sum is one
# term, so the rows of a batch that takes the table equal the rows evaluated
# one at a time (fewer rows than the tables need; the row term is the same
# in both). Normalized, the table holds lnpoch - log n! rounded once to the
# compute type where the direct path subtracts in float64: within a rounding
# of the term. Concentrations from the float64 redo's region (log a < 0) to
# the scaled one (a >= kStirlingMin), counts 0..16.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
def test_cpu_table_entries_are_the_direct_values(dtype, normalize):
    counts = torch.arange(17, dtype=dtype).reshape(17, 1)
    eps = torch.finfo(dtype).eps
    for la in torch.tensor([-6.0, -2.5, -1.2, -0.3, 0.0, 0.7, 2.0, 2.1, 2.5, 3.9, 9.0]).to(dtype):
        la = la.reshape(1) + torch.empty(1, dtype=dtype).uniform_(-0.05, 0.05)
        batch = dirmult_ext.log_lik(counts, la, normalize=normalize)
        alone = torch.cat([dirmult_ext.log_lik(counts[i:i + 1], la, normalize=normalize)
                           for i in range(17)])
        if not normalize:
            assert torch.equal(batch, alone), (la.item(), (batch - alone).abs().max().item())
        else:
            n, a = counts.double()[:, 0], la.double().exp()
            lnpoch = torch.lgamma(a + n) - torch.lgamma(a)
            scale = lnpoch.abs() + torch.lgamma(n + 1)  # the two terms subtracted
            assert ((batch - alone).abs().double() <= 2 * eps * scale.clamp_min(1.0)).all()


# ------------------------------------------------- per-sample float32 forward


def _per_sample_counts(B, V, dtype):
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
    counts = _per_sample_counts(B, V, dtype)
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
    counts = _per_sample_counts(B, V, torch.float32)
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
    counts = _per_sample_counts(8, 600, torch.float32)
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
    counts = _per_sample_counts(B, V, torch.float32)
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
    counts = _per_sample_counts(B, V, dtype)
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
    counts = _per_sample_counts(3, 300, torch.float32)
    counts[1, 290] = -2.0
    la = torch.empty(3, 300).uniform_(-3.0, 4.0).requires_grad_()
    g, = torch.autograd.grad(torch.ops.dirmult.log_lik(counts, la, False).sum(), la)
    assert torch.isnan(g[1]).all() and not torch.isnan(g[[0, 2]]).any()
