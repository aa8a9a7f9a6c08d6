"""The hot kernels once each at the benchmark shapes, for Nsight Compute
(scripts/gpu/gpu_check.sh's profile stage): the shared-alpha forward (the ring
kernel), the single pass and the backward at tall, the single pass at wide, the forward at sparse, the component table
kernels at K = 16, and the per-sample forward. Inputs as the benchmark makes them."""
import torch

import dirmult_ext
from dirmult_ext.cli.bench.cases import CUDA_SHAPES, make_counts, make_log_alpha

shapes = {s.name: s for s in CUDA_SHAPES}
dev = torch.device("cuda")
K = 16
g = torch.Generator(device=dev).manual_seed(1)
tall = shapes["tall"]
B, V = tall.B, tall.V
counts = make_counts(tall, g, dev)
la = make_log_alpha((V,), g, dev).requires_grad_()
la_k = make_log_alpha((K, V), g, dev).requires_grad_()
with torch.no_grad():
    dirmult_ext.log_lik(counts, la)  # the forward alone (forward_table_ring_kernel)
out = dirmult_ext.log_lik(counts, la)
torch.autograd.grad(out.sum(), la)  # the single pass (with_grad_kernel)
out = dirmult_ext.log_lik(counts, la)
torch.autograd.grad(out, la, torch.rand_like(out))  # the backward kernels (row weights)
out = dirmult_ext.log_lik_components(counts, la_k)
torch.autograd.grad(out.sum(), la_k)
# wide: few rows, long ones (split into column chunks)
wide = make_counts(shapes["wide"], g, dev)
la_w = make_log_alpha((wide.shape[1],), g, dev).requires_grad_()
torch.autograd.grad(dirmult_ext.log_lik(wide, la_w).sum(), la_w)
# sparse: 1% nonzero, stored dense (forward only: the table kernel with 16 chunks)
sparse = make_counts(shapes["sparse"], g, dev)
dirmult_ext.log_lik(sparse, make_log_alpha((sparse.shape[1],), g, dev))
# per-sample alpha (forward), 8192 rows of the tall shape
ps = counts[:8192]
dirmult_ext.log_lik(ps, make_log_alpha(ps.shape, g, dev))
torch.cuda.synchronize()
print("profiled: log_lik fwd+bwd and log_lik_components fwd+bwd at", (B, V, K),
      "and log_lik fwd+bwd at", tuple(wide.shape), "and fwd at", tuple(sparse.shape))
