"""log_lik_components on CUDA: the shapes that run log_lik's kernels once per
component (long rows, few components) and the ways forced by
DIRMULT_CUDA_COMPONENTS. Runs on the GPU machine (scripts/gpu/gpu_check.sh);
skipped without CUDA."""
import os
import subprocess
import sys

import pytest
import torch

import dirmult_ext

from reference import components_float64, components_grad_float64, mixed_counts

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                       reason="needs a CUDA device (runs in scripts/gpu/gpu_check.sh)"),
]


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
    g64 = components_grad_float64(counts, la.detach(), w).to(g.device)
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
            "from test_cuda_components import _forced_way_results, _kernels_launched\n"
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
    g64 = components_grad_float64(counts, la, w).to(forced[2].device)
    assert ((forced[2].double() - g64).abs() / g64.abs().amax(1, keepdim=True)).max() < 1e-5
