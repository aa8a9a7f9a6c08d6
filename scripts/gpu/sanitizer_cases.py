"""Runs every CUDA kernel once on small inputs (all code paths: vector and
scalar loads, split rows, per-sample alpha, components with and without
lookup tables, counts gradient, float64, the single pass and the backward
kernels it replaces for a sum) for compute-sanitizer. Exits non-zero on a wrong answer."""
import torch

import dirmult_ext


def draw_counts(B, V, dtype, first, off_table):
    """Counts 0..11 with counts[0, 0] = first and a fraction off_table of
    them at 20..299 (the chunked products and the general path)."""
    counts = torch.randint(0, 12, (B, V), device="cuda").to(dtype)
    counts[0, 0] = first
    far = torch.rand(B, V, device="cuda") < off_table
    counts[far] = torch.randint(20, 300, (int(far.sum()),), device="cuda").to(dtype)
    return counts


def case(B, V, dtype=torch.float32, shared=True, counts_grad=False, K=None, weighted=False,
         off_table=0.0):
    """weighted: the backward gets row weights that are not one number (the
    backward kernels run); else the gradient of the sum (the single pass,
    where it applies). off_table: as draw_counts."""
    counts = draw_counts(B, V, dtype, 20, off_table)  # beyond the exact path
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    if K is not None:
        la = torch.randn(K, V, dtype=compute, device="cuda", requires_grad=True)
        out = dirmult_ext.log_lik_components(counts, la, normalize=True)
        torch.autograd.grad(out.sum(), la)
        ref = torch.stack([dirmult_ext.log_lik(counts.cpu(), la[k].detach().cpu(), normalize=True)
                           for k in range(K)], -1)
    else:
        la = torch.randn((V,) if shared else (B, V), dtype=compute, device="cuda", requires_grad=True)
        if counts_grad:
            counts.requires_grad_()
        out = dirmult_ext.log_lik(counts, la, normalize=True)
        w = torch.rand_like(out)
        if weighted == "masked":
            w[8:24] = 0.0  # whole zero-weight batches: skipped unread
        loss = (out * w).sum() if weighted else out.sum()
        torch.autograd.grad(loss, [la, counts] if counts_grad else [la])
        ref = dirmult_ext.log_lik(counts.detach().cpu(), la.detach().cpu(), normalize=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.detach().cpu(), ref, rtol=1e-5, atol=1e-3)


def forward_case(B, V, dtype=torch.float32, off_table=0.0):
    """The forward alone (no gradient wanted: the forward kernels, not the
    single pass)."""
    counts = draw_counts(B, V, dtype, 20.5, off_table)  # off the table
    la = torch.randn(V, device="cuda")
    with torch.no_grad():
        out = dirmult_ext.log_lik(counts, la, normalize=True)
    ref = dirmult_ext.log_lik(counts.cpu(), la.cpu(), normalize=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-3)


def regression_case(B, V, P, dtype=torch.float32, compute=torch.float32, bias=True,
                    off_table=0.0):
    """log_lik_regression and its backward (weighted rows, some of weight 0)
    against the CPU kernels."""
    counts = draw_counts(B, V, dtype, 20, off_table)
    X = torch.randn(B, P, dtype=compute, device="cuda")
    W = torch.randn(P, V, dtype=compute, device="cuda") * (0.5 / P ** 0.5)
    b = torch.randn(V, dtype=compute, device="cuda") * 0.5 if bias else None
    leaves = [t.requires_grad_() for t in (X, W, b) if t is not None]
    out = dirmult_ext.log_lik_regression(counts, X, W, b, normalize=True)
    w = torch.rand_like(out)
    w[::5] = 0.0
    grads = torch.autograd.grad((out * w).sum(), leaves)
    cpu = [t.detach().cpu().requires_grad_() for t in leaves]
    ref = dirmult_ext.log_lik_regression(counts.cpu(), cpu[0], cpu[1],
                                         cpu[2] if bias else None, normalize=True)
    ref_grads = torch.autograd.grad((ref * w.cpu()).sum(), cpu)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-3)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-3 * r.abs().max().item())


if __name__ == "__main__":
    case(37, 256)                   # one-launch small forward; table single pass
    case(40, 1000, torch.float64)   # small forward, four alpha slices in shared memory
    case(40, 1000)                  # table path (float32 rows past 256 columns)
    case(1, 5000)                   # the single pass from one row
    forward_case(1, 5000)           # table forward from one row, few chunks: a global table
    forward_case(1, 40000)          # one row over many chunks: the blocks fill their slices,
                                    # blocks beside them compute alpha's partial totals,
                                    # then finish the row behind a grid barrier (cooperative)
    case(600, 700)                  # table path, chunk shorter than the table slice
    case(300, 1024)                 # table path, one whole chunk, fill a thread per entry
    case(70, 5000)                  # table path, five chunks, fill a thread per column
    case(40, 1500)                  # table path, two chunks (the second ragged)
    case(400, 700, torch.int64)     # table path with 8-byte (float64) counts
    case(37, 256, weighted=True)    # the same three through the backward kernels
    case(40, 1500, weighted=True)
    case(36, 700, torch.int64, weighted=True)
    case(37, 1500, weighted="masked")
    case(30, 300, torch.float64, weighted="masked")
    case(33, 301, torch.uint8)      # single pass: scalar loads, 1-byte counts
    case(52001, 37)                 # two rows per warp (single pass)
    forward_case(52001, 37)         # forward table kernel, two rows per warp
    forward_case(52001, 8)          # ring forward (short rows: zero-filled copies)
    forward_case(40, 210000)        # wide: a persistent block per SM fills its chunks' table
                                    # slices (refinements queued per warp), rows through rings,
                                    # alpha's partial totals in the same launch
    forward_case(33, 300000)        # the same, 2-3 chunks per block
    # Many counts off the table: spread over the warps' lanes (spread_marks)
    forward_case(600, 1024, off_table=0.3)   # ring forward
    forward_case(40, 70000, off_table=0.3)   # in-block fill ring
    forward_case(300, 5001, off_table=0.3)   # forward table kernel, scalar loads
    case(300, 1024, off_table=0.3)                 # single pass
    case(300, 1024, off_table=0.3, weighted=True)  # column backward
    forward_case(36, 210001, torch.int64)  # a block per chunk fills its own slice, one row
                                    # in flight per warp (8-byte counts, scalar loads)
    case(5, 301)                    # scalar loads (V % 4 != 0)
    case(3, 9000)                   # few rows over a few chunks (single pass, global tables)
    case(3, 70000)                  # few rows over many chunks: the single pass's blocks fill
    case(2, 70001, torch.int64)     # both table slices (8-byte counts, scalar loads)
    case(3, 9000, weighted=True)    # the same through the forward and column backward
    case(3, 9000, torch.float64)    # split rows (math path)
    case(20, 64, torch.uint8)
    case(11, 130, torch.float64, shared=False)
    case(9, 2100, shared=False)     # per-sample, split rows
    case(300, 1024, shared=False, weighted=True)  # per-sample float32 kernels, vector loads
    case(9, 2101, torch.uint8, shared=False)      # per-sample float32 kernels, scalar loads
    case(13, 70, shared=False, counts_grad=True)  # per-sample with the counts gradient
    case(13, 70, counts_grad=True)
    case(17, 1500, K=5)             # components: tables forward, math path backward (< 32 rows)
    case(40, 1030, K=4)             # component tables, K <= 4, ragged slices
    case(40, 5001, K=8)             # component tables, fill a thread per column, last warp ragged
    case(4, 70000, K=2)             # long rows: log_lik's kernels per component, both ways
    case(33, 301, K=7)              # component tables, K <= 8, scalar loads
    case(64, 260, torch.uint8, K=18)  # component tables, two component blocks
    case(6, 33, torch.int64, K=9)
    regression_case(300, 1024, 16)  # X @ W + bias (addmm), log_lik's per-sample float32 kernels
    regression_case(41, 301, 5, torch.uint8, bias=False)  # no bias (a matmul), 1-byte counts
    regression_case(20, 300, 20, compute=torch.float64, off_table=0.3)  # float64 per-sample kernels
    la = torch.randn(50, device="cuda")
    torch.ops.dirmult.poch_terms(la, torch.rand(50, device="cuda") * 40)
    torch.cuda.synchronize()
    print("sanitizer cases: all ran and matched the CPU kernels")
