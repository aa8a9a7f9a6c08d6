"""The hot kernels once each at the tall benchmark shape, for Nsight Compute
(scripts/gpu_check.sh's profile stage): the shared-alpha forward and
backward table kernels, and the component table kernels at K = 16."""
import torch

import dirmult_ext

B, V, K = 65536, 1024, 16
g = torch.Generator(device="cuda").manual_seed(1)
counts = torch.randint(0, 10, (B, V), generator=g, device="cuda", dtype=torch.float32)
la = (torch.randn(V, generator=g, device="cuda") * 0.5).requires_grad_()
la_k = (torch.randn(K, V, generator=g, device="cuda") * 0.5).requires_grad_()
out = dirmult_ext.log_lik(counts, la)
torch.autograd.grad(out.sum(), la)
out = dirmult_ext.log_lik_components(counts, la_k)
torch.autograd.grad(out.sum(), la_k)
# wide: few rows, long ones (split into column chunks)
wide = torch.randint(0, 10, (64, 262144), generator=g, device="cuda", dtype=torch.float32)
la_w = (torch.randn(262144, generator=g, device="cuda") * 0.5).requires_grad_()
torch.autograd.grad(dirmult_ext.log_lik(wide, la_w).sum(), la_w)
torch.cuda.synchronize()
print("profiled: log_lik fwd+bwd and log_lik_components fwd+bwd at", (B, V, K),
      "and log_lik fwd+bwd at", tuple(wide.shape))
