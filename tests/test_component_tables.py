"""log_lik_components on the lookup-table path (float32; the backward's from
32 rows): every component block size (K up to 4, up to 8, up to 16, and more than 16,
which takes several passes), several column slices with a ragged end, counts
off the table (large and non-integer), bad counts and concentrations. Then
the shapes that run log_lik's kernels once per component instead (CPU: all;
CUDA: long rows, few components): log_lik's bits per component."""
import os
import subprocess
import sys

import pytest
import torch

import dirmult_ext

from reference import components_float64


def mixed_counts(B, V, device, dtype=torch.float32):
    """Mostly zeros and small integers, with some counts off the table."""
    counts = torch.randint(0, 17, (B, V)).double()
    counts *= torch.rand(B, V) > 0.6
    big = torch.rand(B, V) < 0.02
    counts[big] = torch.randint(17, 300, (int(big.sum()),)).double()
    if dtype.is_floating_point:
        frac = torch.rand(B, V) < 0.02
        counts[frac] = torch.rand(int(frac.sum())).double() * 30
    else:
        counts.clamp_(max=255)
    return counts.to(dtype=dtype, device=device)


def weighted_component_grads(counts, la64, w):
    """d sum(w * log_lik_components) / d log_alpha, computed in float32 and in
    float64 (both returned as float64)."""
    grads = []
    for dtype in (torch.float32, torch.float64):
        la = la64.to(dtype).requires_grad_()
        out = dirmult_ext.log_lik_components(counts.to(dtype), la)
        grads.append(torch.autograd.grad((out * w.to(dtype)).sum(), la)[0].double())
    return grads


@pytest.mark.parametrize("K", [1, 3, 7, 16, 21])
@pytest.mark.parametrize("normalize", [False, True])
def test_forward_matches_float64(device, K, normalize):
    B, V = int(torch.randint(40, 200, ())), int(torch.randint(900, 1300, ()))
    counts = mixed_counts(B, V, device)
    log_alpha = torch.empty(K, V).uniform_(-4, 5).to(device)
    out = dirmult_ext.log_lik_components(counts, log_alpha, normalize=normalize)
    ref = components_float64(counts, log_alpha, normalize)
    scale = ref.abs().amax(0).clamp_min(1.0)
    assert ((out.double().cpu() - ref).abs() / scale).max() < 2e-6


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float64])
def test_count_dtypes(device, dtype):
    B, V, K = 64, 517, 5
    counts = mixed_counts(B, V, device, dtype)
    log_alpha = torch.empty(K, V).uniform_(-3, 4).to(device)
    out = dirmult_ext.log_lik_components(counts, log_alpha)
    ref = components_float64(counts, log_alpha)
    assert ((out.double().cpu() - ref).abs() / ref.abs().amax(0)).max() < 2e-6


@pytest.mark.parametrize("K", [2, 4, 16, 19])  # CUDA: 2 runs log_lik's kernels, 4 the tables
def test_gradient_matches_float64(device, K):
    B, V = 150, 700
    counts = mixed_counts(B, V, device)
    la64 = torch.empty(K, V, dtype=torch.float64).uniform_(-3, 5).to(device)
    w = torch.randn(B, K, dtype=torch.float64, device=device)
    grads = weighted_component_grads(counts, la64, w)
    scale = grads[1].abs().amax(1, keepdim=True)
    assert ((grads[0] - grads[1]).abs() / scale).max() < 1e-5


def test_bad_counts_and_concentrations(device):
    B, V, K = 64, 300, 6
    counts = mixed_counts(B, V, device)
    counts[5, 17] = -1.0
    counts[9, 0] = float("inf")
    log_alpha = torch.randn(K, V, device=device)
    log_alpha[2, 4] = float("nan")
    out = dirmult_ext.log_lik_components(counts, log_alpha)
    bad_rows = torch.zeros(B, dtype=torch.bool, device=device)
    bad_rows[[5, 9]] = True
    assert torch.isnan(out[bad_rows]).all()
    assert torch.isnan(out[:, 2]).all()
    good = out[~bad_rows][:, [0, 1, 3, 4, 5]]
    assert torch.isfinite(good).all()


def test_sparse_rows_and_empty_rows(device):
    B, V, K = 96, 2000, 12
    counts = torch.zeros(B, V)
    for b in range(0, B, 2):  # every other row empty, the rest very sparse
        idx = torch.randint(0, V, (5,))
        counts[b, idx] = torch.randint(1, 40, (5,)).float()
    counts = counts.to(device)
    log_alpha = torch.empty(K, V).uniform_(-2, 2).to(device)
    out = dirmult_ext.log_lik_components(counts, log_alpha, normalize=True)
    ref = components_float64(counts, log_alpha, True)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-6, atol=2e-5)
    assert (out[1::2] == 0).all()  # an empty row has probability one


# CPU: component k is log_lik with log_alpha[k], by the same kernels, so the
# same bits, forward and gradient: few long rows (column chunks), rows under
# the tables' threshold, table rows; float32 (vector math path) and float64.
@pytest.mark.parametrize("B, V", [(3, 20000), (4, 700), (70, 900)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
def test_cpu_components_are_log_lik_per_component(B, V, dtype, normalize):
    K = 3
    counts = mixed_counts(B, V, "cpu", dtype)
    la = torch.empty(K, V, dtype=dtype).uniform_(-3.0, 3.5)
    w = torch.rand(B, K, dtype=dtype)
    lk = la.clone().requires_grad_()
    out = dirmult_ext.log_lik_components(counts, lk, normalize=normalize)
    g, = torch.autograd.grad((out * w).sum(), lk)
    for k in range(K):
        lg = la[k].clone().requires_grad_()
        row = dirmult_ext.log_lik(counts, lg, normalize=normalize)
        gk, = torch.autograd.grad((row * w[:, k]).sum(), lg)
        assert torch.equal(out[:, k].detach(), row.detach())
        assert torch.equal(g[k], gk)


# CUDA, float32, long rows and few components (components_as_shared_forward
# / _backward, whose predicted times put these shapes on the shared side by
# a wide margin; grad_bits: the backward's too): component k runs log_lik's
# shared-alpha kernels with log_alpha[k], so the same bits as the ops
# log_lik / log_lik_backward: one row, rows split in column chunks, rows
# under and over the backward's table threshold, uint8 counts, and a
# log_alpha that starts off 16-byte alignment (a view at an offset).
@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs a CUDA device (runs in scripts/gpu/gpu_check.sh)")
@pytest.mark.parametrize("B, V, K, grad_bits",
                         [(1, 70000, 5, False), (4, 70000, 2, True), (16, 20000, 2, True),
                          (40, 70000, 2, True)])
@pytest.mark.parametrize("count_dtype", [torch.float32, torch.uint8])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("normalize", [False, True])
def test_cuda_long_rows_are_log_lik_per_component(B, V, K, grad_bits, count_dtype, offset,
                                                   normalize):
    counts = mixed_counts(B, V, "cuda", count_dtype)
    storage = torch.empty(K * V + offset, device="cuda").uniform_(-3.0, 3.5)
    la = storage[offset:].view(K, V)
    w = torch.randn(B, K, device="cuda")
    lk = la.detach().requires_grad_()
    out = dirmult_ext.log_lik_components(counts, lk, normalize=normalize)
    g, = torch.autograd.grad((out * w).sum(), lk)
    # The ops themselves: the Python API's autograd may take log_lik_with_grad,
    # whose gradient of one row is a scale of its own (other bits).
    ops = torch.ops.dirmult
    for k in range(K):
        row = ops.log_lik(counts, la[k].detach(), normalize)
        assert torch.equal(out[:, k].detach(), row)
        if grad_bits:
            gk = ops.log_lik_backward(w[:, k].contiguous(), counts, la[k].detach(), normalize,
                                      False)[0]
            assert torch.equal(g[k], gk)
    ref = components_float64(counts, la.detach(), normalize)
    scale = ref.abs().amax(0).clamp_min(1.0)
    assert ((out.detach().double().cpu() - ref).abs() / scale).max() < 2e-6
    _, g64 = weighted_component_grads(counts, la.detach().double(), w.double())
    assert ((g.double() - g64).abs() / g64.abs().amax(1, keepdim=True)).max() < 1e-5


# DIRMULT_CUDA_COMPONENTS forces either CUDA way at any shape (read once per
# process, hence a process per setting). per_component gives log_lik's bits
# per component, forward and backward, even where the rule keeps the fused
# kernels (short rows, many components). fused launches other kernels than
# this process (which follows the rule) where the rule takes log_lik's (long
# rows, few components; the fused kernels' values can be log_lik's bits
# there, so the kernels launched are what tells the ways apart). Both are
# within float32 roundings of float64. The fused backward: the math path
# (under 32 rows) and the component tables.
def _forced_way_results(counts, la, w):
    ops = torch.ops.dirmult
    return [ops.log_lik_components(counts, la, False), ops.log_lik_components(counts, la, True),
            ops.log_lik_components_backward(w, counts, la)]


def _kernels_launched(counts, la, w):
    """The names of the CUDA kernels one forward and one backward launch."""
    from torch.profiler import ProfilerActivity, profile
    ops = torch.ops.dirmult
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ops.log_lik_components(counts, la, False)
        ops.log_lik_components_backward(w, counts, la)
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA})


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs a CUDA device (runs in scripts/gpu/gpu_check.sh)")
@pytest.mark.parametrize("way", ["fused", "per_component"])
@pytest.mark.parametrize("B, V, K, rule_per_component",
                         [(4, 70000, 2, True), (300, 1030, 16, False), (40, 5001, 3, True)])
def test_cuda_forced_components_way(tmp_path, way, B, V, K, rule_per_component):
    counts = mixed_counts(B, V, "cuda")
    la = torch.empty(K, V, device="cuda").uniform_(-3.0, 3.5)
    w = torch.randn(B, K, device="cuda")
    torch.save({"counts": counts, "la": la, "w": w}, tmp_path / "in.pt")
    code = ("import sys, torch, dirmult_ext\n"
            "sys.path.insert(0, sys.argv[3])\n"
            "from test_component_tables import _forced_way_results, _kernels_launched\n"
            "d = torch.load(sys.argv[1])\n"
            "args = d['counts'], d['la'], d['w']\n"
            "torch.save([_forced_way_results(*args), _kernels_launched(*args)], sys.argv[2])\n")
    env = dict(os.environ, DIRMULT_CUDA_COMPONENTS=way)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"),
                    os.path.dirname(os.path.abspath(__file__))], env=env, check=True)
    forced, forced_kernels = torch.load(tmp_path / "out.pt")
    assert forced_kernels  # the profiler saw the launches
    ops = torch.ops.dirmult
    per_component = [
        torch.stack([ops.log_lik(counts, la[k], False) for k in range(K)], dim=1),
        torch.stack([ops.log_lik(counts, la[k], True) for k in range(K)], dim=1),
        torch.stack([ops.log_lik_backward(w[:, k].contiguous(), counts, la[k], False, False)[0]
                     for k in range(K)])]
    if way == "per_component":
        for mine, theirs in zip(forced, per_component):
            assert torch.equal(mine, theirs)
    rule_kernels = _kernels_launched(counts, la, w)
    if rule_per_component == (way == "per_component"):
        assert forced_kernels == rule_kernels
    else:
        assert forced_kernels != rule_kernels
    for normalize, out in zip((False, True), forced[:2]):
        ref = components_float64(counts, la, normalize)
        scale = ref.abs().amax(0).clamp_min(1.0)
        assert ((out.double().cpu() - ref).abs() / scale).max() < 2e-6
    _, g64 = weighted_component_grads(counts, la.double(), w.double())
    assert ((forced[2].double() - g64).abs() / g64.abs().amax(1, keepdim=True)).max() < 1e-5
