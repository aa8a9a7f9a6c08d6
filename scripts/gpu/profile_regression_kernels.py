"""The fused regression kernels once each at the benchmark's shape (65536 x
1024, P = 16 and 64, float32), for Nsight Compute (scripts/gpu/gpu_check.sh's
profile_regression stage): the forward, then the forward+backward of the
summed log-likelihood with respect to X, W and bias. Inputs as the
benchmark makes them (bench/regression_cases.py)."""
import torch

import dirmult_ext
from dirmult_ext.cli.bench.cases import Shape, make_counts

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(1)
B, V = 65536, 1024
counts = make_counts(Shape("regression", B, V), g, dev)
for P in (16, 64):
    X = torch.randn((B, P), generator=g, device=dev)
    W = torch.randn((P, V), generator=g, device=dev) * (0.8 / P ** 0.5)
    b = torch.empty(V, device=dev).uniform_(-0.5, 1.5, generator=g)
    with torch.no_grad():
        dirmult_ext.log_lik_regression(counts, X, W, b)
    leaves = [t.clone().requires_grad_(True) for t in (X, W, b)]
    out = dirmult_ext.log_lik_regression(counts, *leaves)
    torch.autograd.grad(out.sum(), leaves)
    torch.cuda.synchronize()
    print(f"profiled P={P}: {B}x{V}")
