"""The CSR kernels once each at the benchmark's three CSR shapes,
for Nsight Compute (scripts/gpu/gpu_check.sh's profile_csr stage): the
forward (alpha preparation, then the row kernel) and the forward+backward
(row weights, the column gradient over the column-sorted copy), and the
K = 16 components forward at csr_tall. Inputs as the benchmark makes them."""
import torch

import dirmult_ext
from dirmult_ext.cli.bench.cases import make_log_alpha
from dirmult_ext.cli.bench.sparse_cases import SPARSE_SHAPES, make_csr

dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(1)
shapes = {s.name: s for s in SPARSE_SHAPES["cuda"]}
for name in ("csr_square", "csr_tall", "csr_huge"):
    shape = shapes[name]
    sc = make_csr(shape, g, dev)
    la = make_log_alpha((shape.V,), g, dev).requires_grad_()
    with torch.no_grad():
        dirmult_ext.log_lik(sc, la)
    out = dirmult_ext.log_lik(sc, la)
    torch.autograd.grad(out.sum(), la)
    if shape.components:
        with torch.no_grad():
            dirmult_ext.log_lik_components(sc, make_log_alpha((shape.components, shape.V), g, dev))
    torch.cuda.synchronize()
    print(f"profiled {name}: {shape.B}x{shape.V}, {sc.nnz} nonzeros")
    del sc
