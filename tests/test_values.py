"""Forward values against the float64 reference: every count dtype, both
concentration layouts, normalize on and off, odd shapes."""
import os
import subprocess
import sys

import pytest
import torch

import dirmult_ext

from reference import component_magnitudes, components_float64, log_lik_float64, magnitudes

COUNT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                torch.int32, torch.int64, torch.uint8]


def random_counts(shape, dtype, device, high=10, zero_frac=0.5):
    counts = torch.randint(0, high, shape)
    counts = counts * (torch.rand(shape) > zero_frac)
    if counts.numel() and counts.sum() == 0:
        counts.view(-1)[0] = 1
    return counts.to(dtype=dtype, device=device)


def tolerance(dtype):
    # float32 compute: relative to the row's magnitude.
    return 1e-12 if dtype == torch.float64 else 2e-6


@pytest.mark.parametrize("dtype", COUNT_DTYPES)
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
def test_forward_matches_float64(device, dtype, shared, normalize):
    B, V = int(torch.randint(1, 40, ())), int(torch.randint(1, 300, ()))
    counts = random_counts((B, V), dtype, device)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    la_shape = (V,) if shared else (B, V)
    log_alpha = torch.empty(la_shape, dtype=compute).uniform_(-3, 4).to(device)
    out = dirmult_ext.log_lik(counts, log_alpha, normalize=normalize)
    assert out.shape == (B,) and out.dtype == compute and out.device == counts.device
    ref = log_lik_float64(counts, log_alpha, normalize)
    scale = magnitudes(counts, log_alpha, normalize)[0].clamp_min(1.0)
    assert ((out.double().cpu() - ref).abs() / scale).max() < tolerance(dtype)


@pytest.mark.parametrize("shape", [(0, 5), (3, 1), (1, 1), (2, 3, 7), (4, 0, 6), (7,), (5, 4, 2, 3)])
def test_shapes(device, shape):
    counts = random_counts(shape, torch.float32, device) if 0 not in shape else \
        torch.zeros(shape, device=device)
    log_alpha = torch.randn(shape[-1], device=device)
    out = dirmult_ext.log_lik(counts, log_alpha)
    assert out.shape == shape[:-1]
    if out.numel():
        ref = log_lik_float64(counts.reshape(-1, shape[-1]), log_alpha).reshape(shape[:-1])
        torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-6, atol=2e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_no_categories(device, shared):
    """V = 0: every row is empty, its log-likelihood 0, the gradient empty
    (the CPU forward once returned uninitialized memory here)."""
    for _ in range(3):  # fresh allocations, so that garbage would show
        torch.randn(4096, device=device)
        counts = torch.zeros(5, 0, device=device, requires_grad=True)
        la = torch.zeros((0,) if shared else (5, 0), device=device, requires_grad=True)
        out = dirmult_ext.log_lik(counts, la, normalize=True)
        assert torch.equal(out, torch.zeros(5, device=device))
        g_la, g_counts = torch.autograd.grad(out.sum(), [la, counts])
        assert g_la.shape == la.shape and g_counts.shape == counts.shape
    comps = dirmult_ext.log_lik_components(torch.zeros(5, 0, device=device),
                                           torch.zeros(3, 0, device=device))
    assert torch.equal(comps, torch.zeros(5, 3, device=device))


def test_per_sample_3d(device):
    counts = random_counts((3, 4, 50), torch.float32, device)
    log_alpha = torch.randn(3, 4, 50, device=device)
    out = dirmult_ext.log_lik(counts, log_alpha, normalize=True)
    ref = log_lik_float64(counts.reshape(12, 50), log_alpha.reshape(12, 50), True).reshape(3, 4)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-6, atol=2e-5)


def test_wide_rows_are_split_and_exact(device):
    """Few long rows exercise the split-row path (partials summed in order)."""
    counts = random_counts((3, 70001), torch.float32, device, zero_frac=0.9)
    log_alpha = torch.empty(70001).uniform_(-2, 3).to(device)
    out = dirmult_ext.log_lik(counts, log_alpha)
    ref = log_lik_float64(counts, log_alpha)
    assert ((out.double().cpu() - ref).abs() / ref.abs()).max() < 2e-6


@pytest.mark.parametrize("shared", [True, False])
def test_few_long_rows_forward_and_gradient_match_float64(device, shared):
    """Few rows of many columns: split into column chunks on CPU (rows alone
    would leave threads idle); a row with a bad count stays NaN."""
    B, V = 5, 40000
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.5)
    counts[1, 123] = 2.5  # off the exact path
    log_alpha = torch.empty((V,) if shared else (B, V)).uniform_(-2, 3)
    la = log_alpha.to(device).requires_grad_()
    out = dirmult_ext.log_lik(counts.to(device), la, normalize=True)
    ref = log_lik_float64(counts, log_alpha, True)
    assert ((out.detach().double().cpu() - ref).abs() / ref.abs()).max() < 2e-6
    w = torch.randn(B, dtype=torch.float64)
    g, = torch.autograd.grad((out.double() * w.to(device)).sum(), la)
    la64 = log_alpha.double().requires_grad_()
    g64, = torch.autograd.grad(
        (dirmult_ext.reference_log_lik(counts.double(), la64, True) * w).sum(), la64)
    assert ((g.double().cpu() - g64).abs().max() / g64.abs().max()) < 1e-5
    bad = counts.clone()
    bad[3, 30000] = -1.0
    out = dirmult_ext.log_lik(bad.to(device), la.detach(), normalize=True).cpu()
    assert torch.isnan(out).tolist() == [False, False, False, True, False]


def test_alpha_keyword_and_float64_promotion(device):
    counts = random_counts((5, 9), torch.int64, device)
    alpha = torch.rand(9, dtype=torch.float64, device=device) + 0.1
    out = dirmult_ext.log_lik(counts, alpha=alpha)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), log_lik_float64(counts, alpha.log()), rtol=1e-12, atol=1e-10)


def test_large_counts_keep_exact_totals(device):
    """int64 counts above 2^24: N is accumulated exactly."""
    counts = torch.tensor([[2**25 + 1, 3, 0, 2**24 + 7]], dtype=torch.int64, device=device)
    log_alpha = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64, device=device)
    out = dirmult_ext.log_lik(counts, log_alpha)
    torch.testing.assert_close(out.cpu(), log_lik_float64(counts, log_alpha), rtol=1e-13, atol=0)


def test_noninteger_counts(device):
    counts = torch.rand(6, 20, dtype=torch.float64, device=device) * 40
    log_alpha = torch.randn(20, dtype=torch.float64, device=device)
    out = dirmult_ext.log_lik(counts, log_alpha, normalize=True)
    torch.testing.assert_close(out.cpu(), log_lik_float64(counts, log_alpha, True), rtol=1e-11, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8, torch.int32])
@pytest.mark.parametrize("normalize", [False, True])
def test_components_match_separate_calls(device, dtype, normalize):
    B, V, K = int(torch.randint(1, 50, ())), int(torch.randint(1, 200, ())), int(torch.randint(1, 20, ()))
    counts = random_counts((B, V), dtype, device)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    log_alpha = torch.empty(K, V, dtype=compute).uniform_(-3, 4).to(device)
    out = dirmult_ext.log_lik_components(counts, log_alpha, normalize=normalize)
    assert out.shape == (B, K)
    ref = components_float64(counts, log_alpha, normalize)
    # Relative to each output's terms (the max |ref| of all outputs failed
    # once in a few hundred runs: 2.1e-6, a row whose terms cancel).
    scale = component_magnitudes(counts, log_alpha, normalize).clamp_min(1.0)
    assert ((out.double().cpu() - ref).abs() / scale).max() < tolerance(dtype)


def test_module_matches_function(device):
    V = 33
    model = dirmult_ext.DirichletMultinomialLogLik(V, torch.randn(V)).to(device)
    counts = random_counts((8, V), torch.float32, device)
    torch.testing.assert_close(model(counts), dirmult_ext.log_lik(counts, model.log_alpha))


def test_results_are_deterministic(device):
    counts = random_counts((300, 2000), torch.float32, device)
    log_alpha = torch.randn(2000, device=device, requires_grad=True)
    out1 = dirmult_ext.log_lik(counts, log_alpha)
    g1, = torch.autograd.grad(out1.sum(), log_alpha)
    out2 = dirmult_ext.log_lik(counts, log_alpha)
    g2, = torch.autograd.grad(out2.sum(), log_alpha)
    assert torch.equal(out1, out2) and torch.equal(g1, g2)


# Bad counts far outside int's range: the CPU table test once converted them
# to int first (undefined) and read before the table; -2^31 crashed. Every
# path gives NaN for the bad rows only, the others stay exact.
@pytest.mark.parametrize("B", [8, 70])  # CUDA: math path / lookup tables; CPU: tables
def test_extreme_negative_counts_give_nan_rows(device, B):
    bad = [-1.0, -2.0 ** 31, -3e9, -float("inf"), float("nan"), -0.5]
    for dtype in (torch.float32, torch.float64):
        counts = random_counts((B, 6), dtype, "cpu")
        rows = list(range(0, B, max(1, B // len(bad))))[:len(bad)]
        for r, x in zip(rows, bad):
            counts[r, r % 6] = x
        good = torch.ones(B, dtype=torch.bool)
        good[rows] = False
        ref = log_lik_float64(counts[good], torch.zeros(6))
        c = counts.to(device)
        for la in (torch.zeros(6, dtype=dtype, device=device),
                   torch.zeros(B, 6, dtype=dtype, device=device)):
            out = dirmult_ext.log_lik(c, la).cpu()
            assert torch.isnan(out[rows]).all() and not torch.isnan(out[good]).any()
            assert ((out[good].double() - ref).abs() / ref.abs().clamp_min(1.0)).max() < tolerance(dtype)
            g, gc = torch.ops.dirmult.log_lik_backward(torch.ones(B, dtype=dtype, device=device),
                                                       c, la, False, True)
            assert torch.isnan(g).any() and gc.shape == c.shape
        comps = dirmult_ext.log_lik_components(c, torch.zeros(3, 6, dtype=dtype, device=device))
        assert torch.isnan(comps[rows]).all() and not torch.isnan(comps[good]).any()
        w = good.to(dtype=dtype, device=device)  # bad rows weigh 0: a finite gradient
        la = torch.zeros(6, dtype=dtype, device=device, requires_grad=True)
        g, = torch.autograd.grad((dirmult_ext.log_lik(c, la) * w).sum(), la)
        assert torch.isfinite(g).all()


# The same bad counts with fewer rows than the CPU's tables need (4): the
# math path, shared and per-sample alpha.
@pytest.mark.parametrize("x", [-1.0, -2.0 ** 31, -3e9, -float("inf"), float("nan"), -0.5])
def test_extreme_negative_count_in_few_rows(device, x):
    counts = random_counts((3, 6), torch.float32, "cpu")
    counts[1, 2] = x
    ref = log_lik_float64(counts[[0, 2]], torch.zeros(6))
    for la in (torch.zeros(6, device=device), torch.zeros(3, 6, device=device)):
        out = dirmult_ext.log_lik(counts.to(device), la).cpu()
        assert torch.isnan(out[1]) and not torch.isnan(out[[0, 2]]).any()
        assert ((out[[0, 2]].double() - ref).abs() / ref.abs().clamp_min(1.0)).max() < 2e-6


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
        "from test_values import _simd_switch_results\n"
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
