"""CUDA-specific behaviour: streams, graph capture, no host syncs, cuda:1.
Runs on the GPU machine (scripts/gpu/gpu_check.sh); skipped without CUDA."""
import pytest
import torch

import dirmult_ext

from reference import (cancelling_rows, component_magnitudes, components_float64,
                       log_lik_float64, magnitudes, per_sample_grad_error, random_counts)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                       reason="needs a CUDA device (runs in scripts/gpu/gpu_check.sh)"),
]


def _fwd_bwd(counts, la):
    out = dirmult_ext.log_lik(counts, la)
    g, = torch.autograd.grad(out.sum(), la)
    return out, g


def _assert_forward_matches_float64(counts, la, tol=2e-6):
    """The CUDA forward of CPU counts and shared log_alpha, normalized and
    not, within tol of the float64 reference relative to the rows'
    magnitudes."""
    for normalize in (False, True):
        with torch.no_grad():
            out = dirmult_ext.log_lik(counts.cuda(), la.cuda(), normalize=normalize).cpu()
        ref = log_lik_float64(counts, la, normalize)
        rows, _ = magnitudes(counts, la, normalize)
        assert ((out.double() - ref).abs() / rows.clamp_min(1.0)).max() < tol


def test_no_host_synchronization():
    counts = random_counts((300, 3000), torch.float32, "cuda")
    la = torch.randn(3000, device="cuda", requires_grad=True)
    la_k = torch.randn(4, 3000, device="cuda", requires_grad=True)
    _fwd_bwd(counts, la)  # warm-up (allocator, library loads)
    torch.autograd.grad(dirmult_ext.log_lik(counts, la).mean(), la)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _fwd_bwd(counts, la)
        torch.autograd.grad(dirmult_ext.log_lik(counts, la).mean(), la)
        torch.autograd.grad(dirmult_ext.log_lik(counts, la), la, torch.rand(300, device="cuda"))
        out = dirmult_ext.log_lik_components(counts, la_k)
        torch.autograd.grad(out.sum(), la_k)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_runs_on_the_current_stream():
    counts = random_counts((64, 5000), torch.float32, "cuda")
    la = torch.randn(5000, device="cuda")
    stream = torch.cuda.Stream()
    expected = dirmult_ext.log_lik(counts, la)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        big = random_counts((2048, 5000), torch.float32, "cuda")  # queued work first
        big.mul_(1.0)
        out = dirmult_ext.log_lik(counts, la)
    stream.synchronize()
    torch.testing.assert_close(out, expected)


def test_cuda_graph_capture():
    counts = random_counts((128, 700), torch.float32, "cuda")
    la = torch.randn(700, device="cuda")
    grad = torch.ones(128, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            dirmult_ext.log_lik(counts, la)
            torch.ops.dirmult.log_lik_backward(grad, counts, la, False, False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dirmult_ext.log_lik(counts, la)
        g, _ = torch.ops.dirmult.log_lik_backward(grad, counts, la, False, False)
    counts.copy_(random_counts((128, 700), torch.float32, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.double().cpu(), log_lik_float64(counts, la), rtol=2e-6, atol=1e-4)
    la_ref = la.detach().clone().requires_grad_()
    _, g_ref = _fwd_bwd(counts, la_ref)
    torch.testing.assert_close(g, g_ref)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device():
    counts = random_counts((50, 900), torch.float32, "cuda:1")
    la = torch.randn(900, device="cuda:1", requires_grad=True)
    with torch.cuda.device(0):  # the current device is not the input's
        out, g = _fwd_bwd(counts, la)
    assert out.device == counts.device and g.device == counts.device
    torch.testing.assert_close(out.double().cpu(), log_lik_float64(counts, la.detach()),
                               rtol=2e-6, atol=1e-4)
    cpu_out, cpu_g = _fwd_bwd(counts.cpu(), la.detach().cpu().requires_grad_())
    torch.testing.assert_close(g.cpu(), cpu_g, rtol=1e-5, atol=1e-4)


def test_cuda_matches_cpu_kernels():
    for shape, la_shape in [((333, 1030), (1030,)), ((7, 200003), (200003,)), ((61, 77), (61, 77))]:
        counts = random_counts(shape, torch.float32, "cpu", zero_frac=0.8)
        counts[0, :5] = torch.tensor([0.5, 17.0, 300.0, 1e6, 2.5])  # the general paths
        la = torch.empty(la_shape).uniform_(-4, 6)
        for normalize in (False, True):
            la_c = la.clone().requires_grad_()
            la_g = la.cuda().requires_grad_()
            c_cpu = counts.clone().requires_grad_()
            c_gpu = counts.cuda().requires_grad_()
            o_c = dirmult_ext.log_lik(c_cpu, la_c, normalize=normalize)
            o_g = dirmult_ext.log_lik(c_gpu, la_g, normalize=normalize)
            torch.testing.assert_close(o_g.cpu(), o_c, rtol=1e-6, atol=1e-3)
            w = torch.randn(o_c.shape)
            g_c = torch.autograd.grad((o_c * w).sum(), (la_c, c_cpu))
            g_g = torch.autograd.grad((o_g * w.cuda()).sum(), (la_g, c_gpu))
            for a, b in zip(g_g, g_c):
                torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-3)


def test_per_sample_deferred_slow_counts_match_float64():
    # Per-sample rows longer than one deferral group (8 loads per lane), with
    # concentrations below 1 (the float32 results that cancel are redone in
    # float64 after each group) and counts off the exact path, scattered.
    B, V = 48, 2500
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.3)
    counts.view(-1)[torch.randperm(B * V)[:300]] = torch.rand(300) * 50 + 0.5
    la = torch.empty(B, V).uniform_(-3, 1)
    out = dirmult_ext.log_lik(counts.cuda(), la.cuda(), normalize=True)
    ref = log_lik_float64(counts, la, True)
    err = (out.double().cpu() - ref).abs() / ref.abs().clamp_min(1.0)
    assert err.max() < 2e-6


@pytest.mark.parametrize("V", [3000, 20])
@pytest.mark.parametrize("normalize", [False, True])
def test_per_sample_cancelling_terms_match_float64(V, normalize):
    # Long rows (3000: three deferral groups and a tail) keep their cancelling terms' float32
    # values, whose error bound (2^-22 of the row's magnitudes) the large
    # terms absorb; short ones (20) redo them in float64. Off by 1e-3 in
    # either kind of value, the rows fail.
    counts, la = cancelling_rows(96, V, with_large_terms=V > 20)
    out = dirmult_ext.log_lik(counts.cuda(), la.cuda(), normalize=normalize)
    ref = log_lik_float64(counts, la, normalize)
    scale = magnitudes(counts, la, normalize)[0]
    assert ((out.double().cpu() - ref).abs() / scale).max() < 4e-7


def _per_sample_case(B, V, dtype, generator):
    """Counts for the float32 per-sample kernels: zeros, 1..16 (the exact
    path, both parities of the paired products), 17..24 and fractions (off
    it); log_alpha from tiny to large (the 1/a scaling), some in the
    cancellation band (a < 1). Row 0 starts with four 16s at a just below 8,
    whose products' product overflows float32 (the one-log fallback)."""
    counts = torch.randint(0, 25, (B, V), generator=generator).double()
    counts[torch.rand(B, V, generator=generator) < 0.4] = 0
    frac = torch.rand(B, V, generator=generator) < 0.03
    counts[frac] += 0.37
    la = torch.empty(B, V).uniform_(-9, 12, generator=generator)
    band = torch.rand(B, V, generator=generator) < 0.3
    la[band] = torch.empty(int(band.sum())).uniform_(-2, 0, generator=generator)
    counts[0, :4] = 16.0
    la[0, :4] = torch.tensor(7.9).log()
    if dtype == torch.uint8:
        counts = counts.floor()
    return counts.to(dtype), la.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.float64])
@pytest.mark.parametrize("shape", [(67, 1003), (3, 70001), (1000, 36)])
@pytest.mark.parametrize("normalize", [False, True])
def test_per_sample_float32_kernels_match_float64(dtype, shape, normalize):
    # forward_per_sample_float_kernel and the per-sample backward: rows of
    # several deferral groups and column chunks (70001: chunk partials),
    # unaligned rows (1003), short rows (36); every count kind. Each row
    # against the float64 formula relative to its terms' magnitudes, each
    # gradient element relative to its own terms. The op itself: the API
    # computes float64 counts in float64.
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    B, V = shape
    counts, la = _per_sample_case(B, V, dtype, g)
    la_d = la.cuda().requires_grad_()
    out = torch.ops.dirmult.log_lik(counts.cuda(), la_d, normalize)
    assert out.dtype == torch.float32
    ref = log_lik_float64(counts, la, normalize)
    scale = magnitudes(counts, la, normalize)[0].clamp_min(1.0)
    assert ((out.detach().double().cpu() - ref).abs() / scale).max() < 2e-6
    w = torch.randn(B, generator=g)
    grad, = torch.autograd.grad((out * w.cuda()).sum(), la_d)
    assert per_sample_grad_error(grad, counts, la, w) < 1e-5


def test_per_sample_gradient_of_tiny_concentrations_matches_float64():
    # Rows whose concentrations (float32 subnormals) sum below 1 / FLT_MAX,
    # so that dpoch(A, N) ~ 1 / A is past float32, beside ordinary rows, in
    # one launch: the backward's difference adpoch(a, n) - a dpoch(A, N)
    # stays finite and accurate (float64 there; a float one was measured
    # no faster, docs/PERFORMANCE_LEDGER.md).
    B, V = 64, 3
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.3)
    la = torch.empty(B, V).uniform_(-3, 4)
    la[::2] = torch.empty(B // 2, V).uniform_(-90.5, -90.0)
    assert (la[::2].double().exp().sum(-1) < 1 / torch.finfo(torch.float32).max).all()
    la_d = la.cuda().requires_grad_()
    w = torch.randn(B)
    out = torch.ops.dirmult.log_lik(counts.cuda(), la_d, False)
    grad, = torch.autograd.grad((out * w.cuda()).sum(), la_d)
    assert grad.isfinite().all()
    assert per_sample_grad_error(grad, counts, la, w) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_two_rows_per_warp_forward_matches_float64(dtype):
    # Enough rows per warp for the forward table kernel's two-rows-in-flight
    # variant (launch_forward_table); an odd row count leaves a last pair
    # with one row, V % 4 != 0 takes the scalar loads.
    B, V = 52001, 37
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.4)
    if dtype == torch.float32:
        counts[5, 3] = 40.5  # off the table
        counts[7, 0] = float("nan")  # a bad count: that row only is NaN
    counts = counts.to(dtype)
    la = torch.empty(V).uniform_(-3, 4)
    out = dirmult_ext.log_lik(counts.cuda(), la.cuda(), normalize=True).cpu()
    ref = log_lik_float64(counts, la, True)
    bad = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), bad)
    assert int(bad.sum()) == (1 if dtype == torch.float32 else 0)
    err = (out.double() - ref).abs() / ref.abs().clamp_min(1.0)
    assert err[~bad].max() < 2e-6


# The ring forward (forward_table_ring_kernel): float32 counts in 16-byte
# aligned rows, enough rows per warp, chunks that spread evenly over the SMs
# (launch_forward_table). A ragged last chunk (zero-filled copies), a row
# count that leaves some warps a row fewer, counts off the table and a bad
# one; one and two chunks; no gradient, so the forward kernel itself runs.
@pytest.mark.parametrize("shape", [(52001, 1020), (25601, 2044)])
def test_ring_forward_matches_float64(shape):
    B, V = shape
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.4)
    counts[5, 3] = 40.5
    counts[6, V - 1] = 300.0
    counts[B - 1, 17] = 2.5
    counts[7, 0] = float("nan")
    la = torch.empty(V).uniform_(-3, 4)
    for normalize in (False, True):
        with torch.no_grad():
            out = dirmult_ext.log_lik(counts.cuda(), la.cuda(), normalize=normalize).cpu()
            # 300 rows take forward_table_kernel: the same sums in the same order
            head = dirmult_ext.log_lik(counts[:300].cuda(), la.cuda(), normalize=normalize).cpu()
        assert torch.equal(out[:300].nan_to_num(7.0), head.nan_to_num(7.0))
        ref = log_lik_float64(counts, la, normalize)
        bad = torch.isnan(ref)
        assert torch.equal(torch.isnan(out), bad) and int(bad.sum()) == 1
        err = (out.double() - ref).abs() / ref.abs().clamp_min(1.0)
        assert err[~bad].max() < 2e-6


# Wide rows: the table is filled a thread per column (more than 4096
# columns) and the float64 refinements of its cancelling entries are queued
# per warp (prep_and_table_kernel): log_alpha mostly in the cancellation band
# (a < 1) with every count 0..16, some a >= 8 (scaled factors). 40x210001:
# the forward's blocks fill their own table slices (fill_table_in_block: one
# block per chunk), the same entries and refinements; 24 rows as many (the
# tables serve float32 from one row). A ragged last chunk, counts off the
# table, a bad row; the single pass's two tables (lnpoch, alpha dpoch)
# through the gradient.
@pytest.mark.parametrize("shape", [(24, 210001), (40, 210001), (40, 9000)])
def test_wide_table_fill_matches_float64(shape):
    B, V = shape
    counts = torch.randint(0, 17, (B, V)).float() * (torch.rand(B, V) > 0.3)
    counts[1, 5] = 40.5
    counts[2, V - 1] = 300.0
    la = torch.empty(V).uniform_(-2.5, 0.5)
    la[::7] = torch.empty(la[::7].shape).uniform_(2.0, 6.0)
    bad = counts.clone()
    bad[3, 7] = float("nan")
    for normalize in (False, True):
        with torch.no_grad():
            out = dirmult_ext.log_lik(bad.cuda(), la.cuda(), normalize=normalize).cpu()
        assert torch.isnan(out[3]) and int(torch.isnan(out).sum()) == 1
        ref = log_lik_float64(counts, la, normalize)
        rows, _ = magnitudes(counts, la, normalize)
        keep = torch.arange(B) != 3
        assert ((out.double() - ref).abs() / rows.clamp_min(1.0))[keep].max() < 2e-6
    la_c = la.cuda().requires_grad_()
    g, = torch.autograd.grad(dirmult_ext.log_lik(counts.cuda(), la_c).sum(), la_c)
    la64 = la.double().requires_grad_()
    g_ref, = torch.autograd.grad(log_lik_float64(counts, la64).sum(), la64)
    _, cols = magnitudes(counts, la)
    assert ((g.double().cpu() - g_ref).abs() / cols.clamp_min(1.0)).max() < 1e-5


# The forward whose blocks fill their own table slices (few rows over more
# chunks than the GPU holds blocks: fill_table_in_block) for every count
# dtype: 8-byte counts take two pieces per chunk, 1-byte and unaligned rows
# scalar loads; counts off the table and a bad count, normalized or not.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8])
@pytest.mark.parametrize("V", [210000, 210001])
def test_in_block_table_fill_forward_matches_float64(dtype, V):
    B = 36
    counts = torch.randint(0, 12, (B, V)).float() * (torch.rand(B, V) > 0.5)
    counts[0, 3] = 23.0
    counts[B - 1, V - 1] = 200.0
    counts = counts.to(dtype)
    la = torch.empty(V).uniform_(-3.0, 2.0)
    _assert_forward_matches_float64(counts, la)
    if dtype != torch.uint8:  # the raw op: a bad count makes its row NaN
        bad = counts.clone()
        bad[5, V // 2] = -1
        nan = torch.isnan(torch.ops.dirmult.log_lik(bad.cuda(), la.cuda(), False)).cpu()
        assert nan[5] and int(nan.sum()) == 1
    la[V - 2] = float("inf")  # A is not finite: every row NaN
    assert torch.isnan(torch.ops.dirmult.log_lik(counts.cuda(), la.cuda(), False)).all()


# The one-launch forward of few aligned float32 rows over many chunks
# (forward_table_fill_ring_kernel): a persistent block per SM fills each of
# its chunks' table slice, then streams the chunk's rows through its warps'
# rings, the next chunk's first rows in flight across that chunk's fill.
# 300 rows: 18-19 rows per warp; 33 rows over 586 chunks: blocks take 4-5
# chunks, warps 1 to 3 rows; 5 rows: most warps have none and only fill.
# Alpha's partial totals go to the blocks with one chunk fewer: fewer
# chunks than SMs (69, 123 on an H200's 132) add blocks with none, which
# only compute them (69: all of them at once, 123: up to two passes); 132
# chunks spread evenly, and the first blocks compute them after their
# chunk. log_alpha in the cancellation band and off it, counts off the
# table (the columns made from log_alpha), normalized or not.
@pytest.mark.parametrize("shape", [(300, 210000), (33, 600000), (5, 300000), (3, 70000),
                                   (4, 125000), (2, 132 * 1024)])
def test_fill_ring_forward_matches_float64(shape):
    B, V = shape
    counts = torch.randint(0, 17, (B, V)).float() * (torch.rand(B, V) > 0.4)
    counts[0, 3] = 23.0
    counts[B - 1, V - 1] = 0.5
    counts[B // 2, V // 2] = 1000.0
    la = torch.empty(V).uniform_(-2.5, 3.0)
    _assert_forward_matches_float64(counts, la)
    # Rows 4 bytes off 16-byte alignment take forward_table_kernel<..., kFill>
    # and finish_rows_kernel, where the ring kernel finishes its rows itself
    # behind a grid barrier: the same sums in the same order.
    storage = torch.empty(B * V + 1, device="cuda")
    unaligned = storage[1:].view(B, V)
    unaligned.copy_(counts)
    for normalize in (False, True):
        with torch.no_grad():
            out = dirmult_ext.log_lik(counts.cuda(), la.cuda(), normalize=normalize)
            other = dirmult_ext.log_lik(unaligned, la.cuda(), normalize=normalize)
        assert torch.equal(out, other)


# Many counts off the table (a third of them: every lane has several, a warp
# hundreds, so spread_marks takes many rounds of 32): integers of the
# chunked products (17..64), of the general path (65..300), non-integers,
# and a bad count in one row (the forward only). Every table kernel that
# takes them: the ring (4096x1024), the in-block fill ring (40x70000), the
# one- and two-row kernels over several chunks (300x5000) and with scalar
# loads (2001x1023); the single pass (gradient of the sum) and the column
# backward (a weighted sum); normalized or not.
@pytest.mark.parametrize("shape", [(4096, 1024), (40, 70000), (300, 5000), (2001, 1023)])
def test_table_paths_with_many_off_table_counts_match_float64(shape):
    B, V = shape
    counts = torch.randint(0, 10, (B, V)).float()
    pick = torch.rand(B, V)
    counts[pick < 0.15] = torch.randint(17, 65, (int((pick < 0.15).sum()),)).float()
    far = (pick >= 0.15) & (pick < 0.25)
    counts[far] = torch.randint(65, 301, (int(far.sum()),)).float()
    frac = (pick >= 0.25) & (pick < 0.33)
    counts[frac] += 0.5
    la = torch.empty(V).uniform_(-2.5, 3.0)
    bad = counts.clone()
    bad[B // 2, V // 3] = float("nan")
    for normalize in (False, True):
        with torch.no_grad():
            out = dirmult_ext.log_lik(bad.cuda(), la.cuda(), normalize=normalize).cpu()
        nan = torch.isnan(out)
        assert nan[B // 2] and int(nan.sum()) == 1
        keep = torch.arange(B) != B // 2
        ref = log_lik_float64(counts, la, normalize)
        rows, _ = magnitudes(counts, la, normalize)
        assert ((out.double() - ref).abs() / rows.clamp_min(1.0))[keep].max() < 2e-6
    w = torch.rand(B, dtype=torch.float64)
    la64 = la.double().requires_grad_()
    _, cols = magnitudes(counts, la)
    for weights in (None, w):
        la_c = la.cuda().requires_grad_()
        out = dirmult_ext.log_lik(counts.cuda(), la_c)
        loss = out.sum() if weights is None else (out * weights.float().cuda()).sum()
        g, = torch.autograd.grad(loss, la_c)
        ref = log_lik_float64(counts, la64)
        g_ref, = torch.autograd.grad(ref.sum() if weights is None else (ref * weights).sum(), la64)
        assert ((g.double().cpu() - g_ref).abs() / cols.clamp_min(1.0)).max() < 1e-5


# Components whose K * V table columns (more than 4096: a thread per column)
# leave the fill's last warp partly past the table: those lanes stay for the
# warp's queued refinements.
def test_component_table_fill_ragged_warp_matches_float64():
    B, K, V = 40, 3, 5001
    counts = torch.randint(0, 17, (B, V)).float() * (torch.rand(B, V) > 0.3)
    la = torch.empty(K, V).uniform_(-2.5, 3.0)
    for normalize in (False, True):
        out = dirmult_ext.log_lik_components(counts.cuda(), la.cuda(), normalize=normalize).cpu()
        ref = components_float64(counts, la, normalize)
        assert ((out.double() - ref).abs() / ref.abs().amax(0).clamp_min(1.0)).max() < 2e-6


# One launch for small problems (forward_small_kernel: B * V <= 2**18 and
# V <= 256 for float32 log_alpha, 1024 for float64), the table path past
# either limit; the float64 reference on both sides of each, every count
# dtype, normalized or not.
@pytest.mark.parametrize("shape", [(1, 5), (1, 256), (1, 257), (31, 1024), (256, 1024),
                                   (257, 1024), (300, 1025), (512, 256), (1024, 256),
                                   (1025, 256), (4096, 64), (4097, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.uint8])
def test_small_and_table_forward_paths_match_float64(shape, dtype):
    counts = random_counts(shape, torch.float32, "cpu", zero_frac=0.3)
    counts[0, 0] = 23.0  # off the table (the math path's general branch)
    counts = counts.to(dtype)
    la = torch.empty(shape[1]).uniform_(-3, 4)
    _assert_forward_matches_float64(counts, la, 1e-12 if dtype == torch.float64 else 2e-6)


def test_small_forward_bad_inputs_give_nan():
    counts = random_counts((40, 250), torch.float32, "cuda")
    counts[3, 7] = -1.0
    counts[5, 2] = float("nan")
    la = torch.randn(250, device="cuda")
    out = torch.ops.dirmult.log_lik(counts, la, False)
    nan = torch.isnan(out).cpu()
    assert nan[3] and nan[5] and int(nan.sum()) == 2
    la[11] = float("inf")
    assert torch.isnan(torch.ops.dirmult.log_lik(counts, la, False)).all()


# Float32 tables from one row (use_tables): few rows over one chunk (the
# global table), a few chunks and many (the forward's blocks fill their own
# slices, a ragged last one) take the table forward, the column backward
# (a weighted sum) and the components' table forward, whose backward keeps
# the math path below kComponentBackwardTableMinRows rows. Counts off the
# table, a bad row, normalized or not; the float64 reference.
@pytest.mark.parametrize("B", [1, 3, 31])
@pytest.mark.parametrize("V", [300, 5000, 70001])
def test_few_row_table_paths_match_float64(B, V):
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.3)
    counts[0, 1], counts[B - 1, V - 1] = 23.0, 2.5  # off the table
    la = torch.empty(V).uniform_(-2.5, 3.0)
    _assert_forward_matches_float64(counts, la)
    bad = counts.clone()
    bad[B // 2, 7] = -1.0
    nan = torch.isnan(dirmult_ext.log_lik(bad.cuda(), la.cuda())).cpu()
    assert nan[B // 2] and int(nan.sum()) == 1
    w = torch.rand(B, dtype=torch.float64)
    lg = la.cuda().requires_grad_()
    g, = torch.autograd.grad((dirmult_ext.log_lik(counts.cuda(), lg) * w.float().cuda()).sum(), lg)
    l64 = la.double().requires_grad_()
    g64, = torch.autograd.grad((log_lik_float64(counts, l64) * w).sum(), l64)
    _, cols = magnitudes(counts, la)
    assert ((g.double().cpu() - g64).abs() / cols.clamp_min(1.0)).max() < 1e-5
    lak = torch.stack([la, la.flip(0), la * 0.5])
    outk = dirmult_ext.log_lik_components(counts.cuda(), lak.cuda()).cpu()
    refk = components_float64(counts, lak)
    scale = component_magnitudes(counts, lak).clamp_min(1.0)
    assert ((outk.double() - refk).abs() / scale).max() < 2e-6
    lkg = lak.cuda().requires_grad_()
    gk, = torch.autograd.grad(dirmult_ext.log_lik_components(counts.cuda(), lkg).sum(), lkg)
    lk64 = lak.double().requires_grad_()
    gk64, = torch.autograd.grad(components_float64(counts, lk64).sum(), lk64)
    colsk = torch.stack([magnitudes(counts, l)[1] for l in lak])
    assert ((gk.double().cpu() - gk64).abs() / colsk.clamp_min(1.0)).max() < 1e-5


# table_index decides by float adds whether a count is an integer in
# [0, 16]: values at and around every edge of that test, in the forward, the
# single pass and the weighted backward (all table kernels; B * V is past
# the small-problem forward).
def test_table_lookup_edge_values_match_float64():
    edges = [0.0, -0.0, 1e-45, 0.5, 1.0, 15.5, 16.0, 16.5, 17.0, 2.0 ** 23 - 1, 2.0 ** 23,
             2.0 ** 23 + 2, 2.0 ** 24, 3.0e9]
    bad = [-0.5, -1.0, -2.0 ** 23, float("inf"), float("-inf"), float("nan")]
    B, V, good = 8192, 40, 8000
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.3)
    for i, x in enumerate(edges):
        counts[i, i % V] = x
        counts[i + 4000, (3 * i + 1) % V] = x
    for i, x in enumerate(bad):
        counts[good + i, i] = x
    la = torch.empty(V).uniform_(-2, 3)
    c, la_c = counts.cuda(), la.cuda().requires_grad_()
    out = dirmult_ext.log_lik(c, la_c)
    assert torch.isnan(out[good:good + len(bad)]).all()
    assert not torch.isnan(out[good + len(bad):]).any()
    ok = counts[:good]
    ref = log_lik_float64(ok, la)
    rows, cols = magnitudes(ok, la)
    assert ((out[:good].double().cpu() - ref).abs() / rows.clamp_min(1.0)).max() < 2e-6
    la64 = la.double().requires_grad_()
    g_ref, = torch.autograd.grad(log_lik_float64(ok, la64).sum(), la64)
    g_sum, = torch.autograd.grad(dirmult_ext.log_lik(c[:good], la_c).sum(), la_c)  # single pass
    assert ((g_sum.double().cpu() - g_ref).abs() / cols.clamp_min(1.0)).max() < 1e-5
    w = torch.rand(B)
    w[good:] = 0.0  # bad rows weighted 0 leave the gradient finite
    g_w, = torch.autograd.grad((out * w.cuda()).sum(), la_c)  # the backward kernels
    g_wref, = torch.autograd.grad((log_lik_float64(ok, la64) * w[:good].double()).sum(), la64)
    assert ((g_w.double().cpu() - g_wref).abs() / cols.clamp_min(1.0)).max() < 1e-5


# The table kernels are launched as programmatic dependents of the table
# preparation (launch_dependent); under graph capture that is an edge of the
# graph. Few rows over many chunks take one cooperative launch
# (forward_table_fill_ring_kernel with its grid barrier).
@pytest.mark.parametrize("shape", [(4096, 1024), (40, 210000)])
def test_cuda_graph_capture_table_path(shape):
    B, V = shape
    counts = random_counts((B, V), torch.float32, "cuda")
    la = torch.randn(V, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            dirmult_ext.log_lik(counts, la)
            torch.ops.dirmult.log_lik_with_grad(counts, la, False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dirmult_ext.log_lik(counts, la)
        out2, g = torch.ops.dirmult.log_lik_with_grad(counts, la, False)
    counts.copy_(random_counts((B, V), torch.float32, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    ref = log_lik_float64(counts, la)
    rows, cols = magnitudes(counts, la)
    for o in (out, out2):
        assert ((o.double().cpu() - ref).abs() / rows.clamp_min(1.0)).max() < 2e-6
    la64 = la.double().cpu().requires_grad_()
    g_ref, = torch.autograd.grad(log_lik_float64(counts, la64).sum(), la64)
    assert ((g.double().cpu() - g_ref).abs() / cols.clamp_min(1.0)).max() < 1e-5
