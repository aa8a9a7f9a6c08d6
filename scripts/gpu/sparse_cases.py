"""Runs every CSR kernel (alpha prep and totals, forward, row weights and
their sums, column gradient) on small inputs for compute-sanitizer (memcheck,
racecheck): shared and component log_alpha, float32/float64, int32/int64
indices, empty rows, nnz = 0, B = 0, one long row and one long column, and
offsets and columns outside the matrix (NaN rows, nothing read out of
bounds). Each result is compared with the CPU kernels'. Exits non-zero on a
wrong answer.

  compute-sanitizer --tool memcheck python scripts/gpu/sparse_cases.py
  compute-sanitizer --tool racecheck python scripts/gpu/sparse_cases.py
"""
import torch

import dirmult_ext
from dirmult_ext.ops.csr import csc_parts

ops = torch.ops.dirmult


def draw(B, V, density, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, V, generator=g) < density
    counts = torch.randint(1, 40, (B, V), generator=g).double() * mask
    if B > 2:
        counts[1] = 0.0  # an empty row
    return counts


def check(crow, col, val, la, K_shape, normalize=True):
    """The forward and the backward of (crow, col, val) with log_alpha of
    shape K_shape on CUDA against the CPU."""
    V = la.shape[-1]
    B = crow.numel() - 1
    ptr, rows, cval = csc_parts(crow, col, val, V)
    grad = torch.randn((B,) if la.dim() == 1 else (B, la.shape[0]), dtype=la.dtype)
    if B > 3:
        grad[3] = 0.0  # a row of weight 0
    out_cpu = ops.log_lik_csr(crow, col, val, la, normalize)
    g_cpu = ops.log_lik_csr_backward(grad, crow, val, ptr, rows, cval, la)
    c = [t.cuda() for t in (crow, col, val, la, grad, ptr, rows, cval)]
    out = ops.log_lik_csr(c[0], c[1], c[2], c[3], normalize)
    g = ops.log_lik_csr_backward(c[4], c[0], c[2], c[5], c[6], c[7], c[3])
    torch.cuda.synchronize()
    tol = dict(rtol=1e-5, atol=1e-3, equal_nan=True)
    torch.testing.assert_close(out.cpu(), out_cpu, **tol)
    torch.testing.assert_close(g.cpu(), g_cpu, **tol)


def run_case(B, V, density, K, dtype, index, seed, normalize=True):
    counts = draw(B, V, density, seed)
    csr = counts.to_sparse_csr()
    crow, col = csr.crow_indices().to(index), csr.col_indices().to(index)
    val = csr.values().to(dtype)
    la = torch.randn((V,) if K is None else (K, V), dtype=dtype)
    check(crow, col, val, la, K, normalize)


def main():
    seed = 0
    for dtype in (torch.float32, torch.float64):
        for index in (torch.int32, torch.int64):
            for K in (None, 1, 5, 40):
                for B, V, density in ((9, 13, 0.3), (70, 33, 0.05), (5, 8, 0.0), (0, 6, 0.5),
                                      (3, 1, 1.0), (40, 300, 1.0)):
                    seed += 1
                    run_case(B, V, density, K, dtype, index, seed, normalize=seed % 2 == 0)
    # One long row (2000 nonzeros) and one long column (2000 rows).
    counts = torch.zeros(2000, 2000, dtype=torch.float64)
    counts[5] = torch.randint(1, 9, (2000,)).double()
    counts[:, 7] = torch.randint(0, 9, (2000,)).double()
    csr = counts.to_sparse_csr()
    check(csr.crow_indices(), csr.col_indices(), csr.values().float(), torch.randn(2000), None)
    # Offsets and columns outside the matrix: NaN rows on both devices.
    crow = torch.tensor([0, 2, 2, 4])
    col = torch.tensor([1, 3, 0, 1000])
    val = torch.tensor([2.0, 1.0, 5.0, 3.0])
    check(crow, col, val, torch.randn(4), None)
    check(torch.tensor([0, 2, 1, 9]), torch.tensor([1, 3, 0, 2]), val, torch.randn(4), None)
    # Bad values and non-finite log_alpha.
    check(crow, torch.tensor([1, 3, 0, 2]), torch.tensor([2.0, -1.0, float("nan"), 3.0]),
          torch.randn(4), None)
    la = torch.randn(3, 4)
    la[1, 2] = float("inf")
    check(crow, torch.tensor([1, 3, 0, 2]), val, la, 3)
    print("sparse_cases: all CSR kernels agree with the CPU")


if __name__ == "__main__":
    main()
