"""``--em K``: a K-component mixture's EM iteration on CSR counts, against
its E-step alone (the K-component CSR forward, in the fit's float64 and in
float32) and against the time to copy the CSR bytes to the device: the
matrix on the device, and streamed from pinned host memory in blocks of
rows (CUDA). An iteration's time is ``DMMixture.iter_s``, the fit's own
wall time per EM iteration (its start left out), over ``EM_ITERS``
iterations of one run from random responsibilities."""
from __future__ import annotations

import statistics
from typing import Callable, List, Optional

import torch

from ...data.sparse_counts import SparseCounts
from ...likelihood.log_lik import log_lik_components
from ...models.mixture import fit_mixture
from .cases import make_log_alpha
from .measure import free, median
from .sparse_cases import SparseShape, make_csr
from .timing import Timer

EM_ITERS = 10
EM_SHAPES = {
    "cuda": SparseShape("em_huge", 1_000_000, 50_000, 0.002),
    "cpu": SparseShape("em_cpu", 8192, 2048, 0.03),
    "quick": SparseShape("em_quick", 512, 256, 0.05),
}
# Rows per streamed block (the and big_sparse_fit.py's 200000 at 1e6 rows).
STREAM_BLOCKS = 5


def copy_seconds(crow: torch.Tensor, parts: List[torch.Tensor], batch_rows: int,
                 reps: int = 3) -> float:
    """Seconds to copy CSR parts held in pinned host memory (``crow`` the
    row offsets, ``parts`` the per-nonzero arrays) to the current CUDA
    device a block of ``batch_rows`` rows at a time, into two alternating
    device buffers: CUDA events, median of ``reps``."""
    rows = crow.numel() - 1
    bounds = [(s, min(s + batch_rows, rows)) for s in range(0, rows, batch_rows)]
    most = max(int(crow[e] - crow[s]) for s, e in bounds)
    bufs = [(torch.empty(batch_rows + 1, dtype=crow.dtype, device="cuda"),
             [torch.empty(most, dtype=p.dtype, device="cuda") for p in parts]) for _ in range(2)]
    times = []
    for _ in range(reps):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for i, (s, e) in enumerate(bounds):
            a, b = int(crow[s]), int(crow[e])
            dc, dp = bufs[i % 2]
            dc[:e - s + 1].copy_(crow[s:e + 1], non_blocking=True)
            for d, p in zip(dp, parts):
                d[:b - a].copy_(p[a:b], non_blocking=True)
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) / 1e3)
    return statistics.median(times)


def _iter_us(counts, K: int, device, batch_size: Optional[int], seed: int) -> dict:
    m = fit_mixture(counts, K, n_init=1, n_screen=0, max_iter=EM_ITERS, tol=1e-300,
                    seed=seed, init="random", device=device, batch_size=batch_size,
                    progress=False)
    return {"iter_us": m.iter_s * 1e6, "n_iter": m.n_iter}


def bench_em(shape: SparseShape, K: int, g: torch.Generator, device: torch.device,
             timer: Timer, log: Callable[[str], None]) -> dict:
    sc = make_csr(shape, g, device)
    B, V = shape.B, shape.V
    la32 = make_log_alpha((K, V), g, device)
    la64 = la32.double()
    nbytes = sum(t.numel() * t.element_size()
                 for t in (sc.crow_indices, sc.col_indices, sc.values))
    res = {"name": shape.name, "B": B, "V": V, "density": shape.density, "nnz": sc.nnz,
           "K": K, "csr_bytes": nbytes, "iters": EM_ITERS, "times": {}}
    t = res["times"]
    log(f"  em {shape.name}: the E-step's forward, K={K}")
    sc.csc()
    t["estep_fwd_f64"] = timer(lambda: log_lik_components(sc, la64))
    t["estep_fwd_f32"] = timer(lambda: log_lik_components(sc, la32))
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=g, device=device))
    log(f"  em {shape.name}: {EM_ITERS} EM iterations, the matrix on the device")
    res["on_device"] = _iter_us(sc, K, device, None, seed)
    fwd = median(t["estep_fwd_f64"])
    res["ratio_iter_estep"] = res["on_device"]["iter_us"] / fwd
    if device.type == "cuda":
        host = SparseCounts(sc.crow_indices.cpu().pin_memory(), sc.col_indices.cpu().pin_memory(),
                            sc.values.cpu().pin_memory(), sc.shape, validate=False)
        del sc
        free(device)
        rows = -(-B // STREAM_BLOCKS)
        res["stream_batch_rows"] = rows
        res["copy_us"] = copy_seconds(host.crow_indices, [host.col_indices, host.values],
                                      rows) * 1e6
        log(f"  em {shape.name}: {EM_ITERS} EM iterations, streamed from pinned host memory "
            f"in {rows}-row blocks")
        res["streamed"] = _iter_us(host, K, device, rows, seed)
        res["ratio_streamed_copy"] = res["streamed"]["iter_us"] / res["copy_us"]
        res["ratio_streamed_target"] = res["streamed"]["iter_us"] / max(
            1.5 * res["copy_us"], res["on_device"]["iter_us"])
    free(device)
    return res
