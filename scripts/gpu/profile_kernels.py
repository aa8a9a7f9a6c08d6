"""The hot kernels once each at the benchmark shapes, for Nsight Compute
(scripts/gpu/gpu_check.sh's profile stage): the shared-alpha forward (the ring
kernel), the single pass and the backward at tall, the single pass at wide, the forward at sparse, the component table
kernels at K = 16, and the per-sample forward."""
import torch

import dirmult_ext

B, V, K = 65536, 1024, 16
g = torch.Generator(device="cuda").manual_seed(1)
counts = torch.randint(0, 10, (B, V), generator=g, device="cuda", dtype=torch.float32)
la = (torch.randn(V, generator=g, device="cuda") * 0.5).requires_grad_()
la_k = (torch.randn(K, V, generator=g, device="cuda") * 0.5).requires_grad_()
with torch.no_grad():
    dirmult_ext.log_lik(counts, la)  # the forward alone (forward_table_ring_kernel)
out = dirmult_ext.log_lik(counts, la)
torch.autograd.grad(out.sum(), la)  # the single pass (with_grad_kernel)
out = dirmult_ext.log_lik(counts, la)
torch.autograd.grad(out, la, torch.rand_like(out))  # the backward kernels (row weights)
out = dirmult_ext.log_lik_components(counts, la_k)
torch.autograd.grad(out.sum(), la_k)
# wide: few rows, long ones (split into column chunks)
wide = torch.randint(0, 10, (64, 262144), generator=g, device="cuda", dtype=torch.float32)
la_w = (torch.randn(262144, generator=g, device="cuda") * 0.5).requires_grad_()
torch.autograd.grad(dirmult_ext.log_lik(wide, la_w).sum(), la_w)
# sparse: 1% nonzero, stored dense (forward only: the table kernel with 16 chunks)
mask = torch.rand((16384, 16384), generator=g, device="cuda") < 0.01
sparse = mask * (1.0 + torch.poisson(torch.full((16384, 16384), 3.0, device="cuda"), generator=g))
del mask
dirmult_ext.log_lik(sparse, torch.randn(16384, generator=g, device="cuda"))
# per-sample alpha (forward), 8192 rows of the tall shape
ps = counts[:8192]
dirmult_ext.log_lik(ps, torch.rand(ps.shape, generator=g, device="cuda") * 5 - 2)
torch.cuda.synchronize()
print("profiled: log_lik fwd+bwd and log_lik_components fwd+bwd at", (B, V, K),
      "and log_lik fwd+bwd at", tuple(wide.shape), "and fwd at", tuple(sparse.shape))
