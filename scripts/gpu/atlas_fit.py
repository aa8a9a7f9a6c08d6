"""The atlas run, measured: a 10-component mixture fitted to a matrix held
in host memory and streamed through one GPU, at a scale where the matrix
(default 10,000,000 x 30,000 with about 2e9 nonzeros, 16 GB as CSR with
int32 column indices and float32 values) is far larger than a block of
rows on the device.

The matrix is generated in memory by the Polya urn of
``write_sparse_matrix.py``'s ``mixture`` kind (exactly Dirichlet-
multinomial rows from k known components), run on the GPU a chunk of rows
at a time, and kept in pinned host memory. Printed (and written to
``--json``, else ``$OUT/atlas.json`` when ``OUT`` is set):

* the time to copy the CSR bytes to the device, in the fit's block size,
  from the pinned matrix (CUDA events, median of 3);
* the fit's seconds per EM iteration (``DMMixture.iter_s``), ``--iters``
  iterations of one run (``n_init=1``, no screening, a tolerance that never stops it), and its
  ratio to the copy time;
* peak host RSS (and above the RSS before the matrix was made), peak GPU
  memory (``torch.cuda.max_memory_allocated``).

    python scripts/gpu/atlas_fit.py                               # on the GPU machine
    python scripts/gpu/atlas_fit.py --rows 200000 --cols 5000     # a smaller try
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
import traceback

import torch


def _rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakWatch:
    """Samples this process's RSS every few ms on a thread and keeps, for
    the highest sample, where the main thread was (its innermost frames)."""

    def __init__(self):
        self.peak, self.where, self._stop = 0, "", False
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop:
            r = _rss_now()
            if r > self.peak:
                frame = sys._current_frames().get(self._main)
                self.peak = r
                self.where = "".join(traceback.format_stack(frame)[-4:]) if frame else ""
            time.sleep(0.002)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def components(gen, k: int, cols: int, precision: float, device):
    """``(k, V)`` concentrations, shares Dirichlet(0.5) per component."""
    shares = torch._standard_gamma(torch.full((k, cols), 0.5, dtype=torch.float64,
                                              device=device), generator=gen) + 1e-12
    return precision * shares / shares.sum(1, keepdim=True)


def urn_chunk(gen, labels, totals, cols: int, alpha):
    """CSR parts (indptr int64, indices int32, values float32) on the device
    of DM rows with the given component labels and totals."""
    dev = alpha.device
    k = alpha.shape[0]
    rows, tmax = labels.numel(), int(totals.max())
    A = alpha.sum(1)[labels]
    cdf = torch.cumsum(alpha / alpha.sum(1, keepdim=True), 1)
    cdf[:, -1] = 1.0
    flat_cdf = (cdf + torch.arange(k, device=dev, dtype=torch.float64)[:, None]).reshape(-1)
    draws = torch.empty(rows, tmax, dtype=torch.int64, device=dev)
    ar = torch.arange(rows, device=dev)
    for i in range(tmax):
        u = torch.rand(rows, generator=gen, device=dev, dtype=torch.float64)
        fresh = u * (A + i) < A
        at = torch.searchsorted(flat_cdf, torch.rand(rows, generator=gen, device=dev,
                                                     dtype=torch.float64) + labels,
                                right=True) - labels * cols
        cat = at.clamp_max(cols - 1)
        if i > 0:
            j = (torch.rand(rows, generator=gen, device=dev) * i).long().clamp_max(i - 1)
            cat = torch.where(fresh, cat, draws[ar, j])
        draws[:, i] = cat
    used = torch.arange(tmax, device=dev)[None, :] < totals[:, None]
    keys = (ar[:, None] * cols + draws)[used]
    del draws
    keys, counts = torch.unique_consecutive(torch.sort(keys).values, return_counts=True)
    r = keys // cols
    indptr = torch.zeros(rows + 1, dtype=torch.int64, device=dev)
    indptr[1:] = torch.cumsum(torch.bincount(r, minlength=rows), 0)
    return indptr, (keys % cols).to(torch.int32), counts.to(torch.float32)


def pinned_empty(n: int, dtype) -> torch.Tensor:
    """An uninitialized host tensor, page-locked in place (cudaHostRegister:
    exactly its bytes, where ``pin_memory=True`` would round up to a power
    of two)."""
    t = torch.empty(n, dtype=dtype)
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.nbytes, 0)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister of {t.nbytes} bytes failed: {rc}")
    return t


def make_matrix(rows, cols, k, precision, tmin, tmax, chunk, seed):
    """The matrix in pinned host memory, filled a chunk at a time: the
    arrays are sized by the sum of the row totals (a bound on the
    nonzeros), so the host never holds the matrix twice."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    alpha = components(gen, k, cols, precision, dev)
    weights = torch.distributions.Dirichlet(torch.full((k,), 5.0, dtype=torch.float64,
                                                       device=dev)).sample()
    labels = torch.multinomial(weights, rows, replacement=True, generator=gen)
    totals = torch.randint(tmin, tmax + 1, (rows,), generator=gen, device=dev)
    bound = int(totals.sum())
    indptr = pinned_empty(rows + 1, torch.int64)
    indices = pinned_empty(bound, torch.int32)
    values = pinned_empty(bound, torch.float32)
    indptr[0] = 0
    nnz = 0
    for s in range(0, rows, chunk):
        e = min(s + chunk, rows)
        ip, ix, v = urn_chunk(gen, labels[s:e], totals[s:e], cols, alpha)
        m = ix.numel()
        indptr[s + 1:e + 1].copy_(ip[1:] + nnz)
        indices[nnz:nnz + m].copy_(ix)
        values[nnz:nnz + m].copy_(v)
        nnz += m
        print(f"  rows {e:,} of {rows:,}", file=sys.stderr, flush=True)
    return indptr, indices[:nnz], values[:nnz], nnz


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--cols", type=int, default=30_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--precision", type=float, default=1000.0,
                   help="each component's sum of concentrations")
    p.add_argument("--total-min", type=int, default=150)
    p.add_argument("--total-max", type=int, default=290)
    p.add_argument("--chunk", type=int, default=500_000, help="rows generated at a time")
    p.add_argument("--batch-rows", type=int, default=1_000_000, help="the fit's block of rows")
    p.add_argument("--iters", type=int, default=5, help="EM iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from dirmult_ext import SparseCounts, fit_mixture
    from dirmult_ext.cli.bench.em_cases import copy_seconds

    torch.zeros(1, device="cuda")
    rss0 = _rss_now()
    t0 = time.perf_counter()
    indptr, indices, values, nnz = make_matrix(a.rows, a.cols, a.k, a.precision, a.total_min,
                                               a.total_max, a.chunk, a.seed)
    gen_s = time.perf_counter() - t0
    csr_bytes = indptr.nbytes + indices.nbytes + values.nbytes
    rss_matrix = _rss_now()
    print(f"matrix: {a.rows:,} x {a.cols:,}, {nnz:,} nonzeros, {csr_bytes / 1e9:.2f} GB "
          f"as CSR (host memory, pinned: {values.is_pinned()}), generated in {gen_s:.1f} s", flush=True)
    copy_s = copy_seconds(indptr, [indices, values], a.batch_rows)
    print(f"copy of the CSR bytes to the device in {a.batch_rows:,}-row blocks: "
          f"{copy_s:.3f} s ({csr_bytes / copy_s / 1e9:.1f} GB/s)", flush=True)
    counts = SparseCounts(indptr, indices, values, (a.rows, a.cols), validate=False)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with PeakWatch() as watch:
        m = fit_mixture(counts, a.k, n_init=1, n_screen=0, max_iter=a.iters, tol=1e-300,
                        seed=a.seed, device="cuda", batch_size=a.batch_rows, progress=True)
    fit_s = time.perf_counter() - t0
    out = {
        "rows": a.rows, "cols": a.cols, "nnz": nnz, "csr_bytes": csr_bytes, "k": a.k,
        "batch_rows": a.batch_rows, "generate_s": gen_s, "copy_s": copy_s,
        "em_iterations": m.n_iter, "iter_s": m.iter_s, "iter_over_copy": m.iter_s / copy_s,
        "fit_s": fit_s, "log_lik": m.log_lik,
        "peak_host_rss": _peak_rss(), "host_rss_before_matrix": rss0,
        "host_rss_with_matrix": rss_matrix, "fit_peak_host_rss": watch.peak,
        "fit_peak_at": watch.where,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
    }
    print(f"fit: {m.n_iter} EM iterations, {m.iter_s:.3f} s each "
          f"({m.iter_s / copy_s:.2f}x the copy), {fit_s:.1f} s in all (with the start)")
    print(f"host RSS: {rss0 / 1e9:.2f} GB before the matrix, {rss_matrix / 1e9:.2f} GB with "
          f"it, peak {out['peak_host_rss'] / 1e9:.2f} GB ({(out['peak_host_rss'] - rss0) / csr_bytes:.2f}x "
          f"the CSR bytes above the process before the matrix); peak GPU memory "
          f"{out['peak_gpu_bytes'] / 1e9:.2f} GB")
    print(f"the fit's highest host RSS, {watch.peak / 1e9:.2f} GB "
          f"({(watch.peak - rss_matrix) / csr_bytes:.2f}x the CSR bytes above the process "
          f"with the matrix), sampled at:\n{watch.where}")
    path = a.json or (os.path.join(os.environ["OUT"], "atlas.json") if os.environ.get("OUT")
                      else None)
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
