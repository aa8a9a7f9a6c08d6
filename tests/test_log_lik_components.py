"""dirmult::log_lik_components and its backward through log_lik_components():
values and gradients against the float64 lgamma formula (with autograd) on
the lookup-table path (float32; the backward's from 32 rows): every
component block size (K up to 4, up to 8, up to 16, and more than 16, which
takes several passes), several column slices with a ragged end, counts off
the table (large and non-integer), count dtypes, bad counts and
concentrations, sparse and empty rows; on CPU, log_lik's bits per component.
The CUDA-only ways: test_cuda_components.py."""
import pytest
import torch

import dirmult_ext

from reference import (component_magnitudes, components_float64, components_grad_float64,
                       grad_tolerances, mixed_counts, random_counts, tolerance)


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
    # Relative to each output's terms, not to the largest |ref| of all
    # outputs: a row whose terms cancel can be off by 2e-6 of the latter.
    scale = component_magnitudes(counts, log_alpha, normalize).clamp_min(1.0)
    assert ((out.double().cpu() - ref).abs() / scale).max() < tolerance(dtype)


def _op_grads(counts, la64, w):
    """d sum(w * log_lik_components) / d log_alpha by the op, in float32 and
    in float64 (both returned as float64 on the CPU)."""
    grads = []
    for dtype in (torch.float32, torch.float64):
        la = la64.to(dtype).requires_grad_()
        out = dirmult_ext.log_lik_components(counts.to(dtype), la)
        grads.append(torch.autograd.grad((out * w.to(dtype)).sum(), la)[0].double().cpu())
    return grads


@pytest.mark.parametrize("K", [2, 4, 16, 19])  # CUDA: 2 runs log_lik's kernels, 4 the tables
def test_gradient_matches_float64(device, K):
    B, V = 150, 700
    counts = mixed_counts(B, V, device)
    la64 = torch.empty(K, V, dtype=torch.float64).uniform_(-3, 5).to(device)
    w = torch.randn(B, K, dtype=torch.float64, device=device)
    ref = components_grad_float64(counts, la64, w)
    scale = ref.abs().amax(1, keepdim=True)
    g32, g64 = _op_grads(counts, la64, w)
    tol32, tol64 = grad_tolerances(device)  # (CPU, seen: 3.2e-7 and 1.2e-14)
    assert ((g32 - ref).abs() / scale).max() < tol32
    assert ((g64 - ref).abs() / scale).max() < tol64


def test_gradcheck_components(device):
    counts = random_counts((5, 7), torch.float64, device, zero_frac=0.3)
    la = torch.empty(3, 7, dtype=torch.float64).uniform_(-2, 3).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda la: dirmult_ext.log_lik_components(counts, la), (la,))


def test_gradient_of_sparse_small_counts_matches_float64(device):
    """Counts under 10, 60% zeros, several components."""
    B, V, K = 300, 1100, 6
    counts = random_counts((B, V), torch.float32, device, zero_frac=0.6)
    la64 = torch.empty(K, V, dtype=torch.float64).uniform_(-3, 5).to(device)
    w = torch.randn(B, K, dtype=torch.float64, device=device)
    ref = components_grad_float64(counts, la64, w)
    g32, g64 = _op_grads(counts, la64, w)
    tol32, tol64 = grad_tolerances(device)  # (CPU, seen: 2.5e-7 and 2.6e-14)
    assert ((g32 - ref).abs() / ref.abs().max()).max() < tol32
    assert ((g64 - ref).abs() / ref.abs().max()).max() < tol64


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
