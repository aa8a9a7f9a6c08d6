"""CUDA-specific behaviour: streams, graph capture, no host syncs, cuda:1.
Runs on the GPU machine (scripts/gpu_check.sh); skipped without CUDA."""
import pytest
import torch

import dirmult_ext

from reference import log_lik_float64
from test_values import random_counts

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                       reason="needs a CUDA device (runs in scripts/gpu_check.sh)"),
]


def _fwd_bwd(counts, la):
    out = dirmult_ext.log_lik(counts, la)
    g, = torch.autograd.grad(out.sum(), la)
    return out, g


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
