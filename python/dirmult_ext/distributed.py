"""Data-parallel Dirichlet-multinomial fitting with ``torch.distributed``.

Each rank holds a shard of the rows. Every pass over the data computes the
sufficient statistics of :mod:`dirmult_ext.fit` on the local shard (weighted
log-likelihood, gradient, trigamma sums q and z, fixed-point denominator,
and in the first pass the moments for the initial value and the row count)
and sums them over ranks with one ``all_reduce`` per pass. Every rank then
holds identical statistics and takes the identical Newton / fixed-point
step, so all ranks end with the same parameters, equal (up to the order of
floating-point summation) to a single-process fit on the concatenated rows.

Backend: ``nccl`` for CUDA devices, ``gloo`` on the CPU.

Launch (one process per GPU)::

    torchrun --nproc_per_node=2 -m dirmult_ext.distributed counts.npy --out params.npz
    torchrun --nproc_per_node=2 -m dirmult_ext.distributed --synthetic --rows 100000

Each rank reads the file (``.npy`` files are memory-mapped) and keeps rows
``[rank * B // world, (rank + 1) * B // world)``. Without torchrun's
environment it runs as a single process (world size 1). With ``--k K`` it
fits a K-component mixture instead
(:func:`dirmult_ext.distributed_mixture.fit_mixture_distributed`)::

    torchrun --nproc_per_node=2 -m dirmult_ext.distributed counts.npz --k 10 --n-init 1
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .fit import DMFit, _as_counts, _as_weights, _check_common, _fit_rows, _Rows
from .sparse import SparseCounts, as_sparse_counts, is_sparse_input

__all__ = ["fit_distributed", "fit_mixture_distributed", "shard_rows", "main"]


def __getattr__(name):
    # distributed_mixture imports this module's reducer: loaded on first use
    if name == "fit_mixture_distributed":
        from .distributed_mixture import fit_mixture_distributed
        return fit_mixture_distributed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _all_reduce_sum(group):
    def reduce(t: Tensor) -> Tensor:
        t = t.contiguous()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t
    return reduce


def shard_rows(n_rows: int, rank: int, world_size: int) -> slice:
    """The contiguous block of rows rank ``rank`` of ``world_size`` holds."""
    return slice(rank * n_rows // world_size, (rank + 1) * n_rows // world_size)


def fit_distributed(local_counts, *, init=None, method: str = "newton", tol: float = 1e-8,
                    max_iter: int = 500, batch_size: Optional[int] = None, weights=None,
                    progress: Optional[bool] = False, device=None, group=None,
                    min_alpha: float = 1e-10, gtol: Optional[float] = None) -> DMFit:
    """Fit one DM to the rows held by all ranks of ``group`` (default: the
    world). Call it on every rank, with that rank's ``(B_r, V)`` counts (B_r
    may be 0; V must agree) and optional ``(B_r,)`` weights; all other
    arguments as :func:`dirmult_ext.fit.fit` and equal on every rank. The
    process group must already be initialized. Returns the same
    :class:`~dirmult_ext.fit.DMFit` on every rank (``n_rows`` counts all
    ranks' rows); progress is shown on rank 0 only.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fit_distributed needs an initialized torch.distributed process "
                           "group (torch.distributed.init_process_group)")
    _check_common(method, tol, max_iter, min_alpha)
    if is_sparse_input(local_counts):  # (sparse shards stay sparse)
        local_counts = as_sparse_counts(local_counts)
    elif isinstance(local_counts, np.ndarray):
        local_counts = torch.from_numpy(np.ascontiguousarray(local_counts))
    if not isinstance(local_counts, (Tensor, SparseCounts)) or len(local_counts.shape) != 2:
        raise ValueError("local_counts must be a (rows, categories) matrix")
    dev = local_counts.device if device is None else torch.device(device)
    if dist.get_backend(group) == "nccl" and dev.type != "cuda":
        raise ValueError("the nccl backend needs device='cuda:<local rank>'")
    # V must agree across ranks (checked before any other collective).
    V = local_counts.shape[1]
    vv = torch.tensor([V, -V], dtype=torch.int64, device=dev)
    dist.all_reduce(vv, op=dist.ReduceOp.MAX, group=group)
    if int(vv[0]) != V or -int(vv[1]) != V:
        raise ValueError(f"all ranks must have the same number of categories; this rank has "
                         f"{V}, others between {-int(vv[1])} and {int(vv[0])}")
    counts = local_counts if local_counts.shape[0] == 0 else _as_counts(local_counts)
    w = _as_weights(weights, counts.shape[0], dev)
    rows = _Rows(counts, w, dev, batch_size)
    show = bool(progress) and dist.get_rank(group) == 0
    return _fit_rows(rows, init=init, method=method, tol=tol,
                     gtol=0.01 * math.sqrt(tol) if gtol is None else gtol, max_iter=max_iter,
                     min_alpha=min_alpha, progress=show, reduce=_all_reduce_sum(group))


# ---------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _synthetic(rows: int, cols: int, seed: int) -> Tensor:
    from .distribution import DirichletMultinomial
    g = torch.Generator().manual_seed(seed)
    alpha = 0.2 + 2 * torch.rand(cols, generator=g, dtype=torch.float64)
    totals = torch.randint(20, 200, (rows,), generator=g)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    x = DirichletMultinomial(totals, alpha).sample().to(torch.float32)
    torch.set_rng_state(state)
    return x


def _fit_one_main(args, local, device, rank, world, backend) -> None:
    t0 = time.perf_counter()
    r = fit_distributed(local, method=args.method,
                        tol=1e-8 if args.tol is None else args.tol,
                        max_iter=500 if args.max_iter is None else args.max_iter,
                        batch_size=args.batch_size, device=device, progress=None)
    fit_s = time.perf_counter() - t0  # (r.log_lik is a host float: the device is done)
    if rank == 0:
        print(f"world size {world} ({backend}), {r.n_rows} rows x {local.shape[1]} "
              f"categories: log-likelihood {r.log_lik:.6f}, {r.n_iter} iterations, "
              f"converged={r.converged}, A={r.precision:.6g}, fit {fit_s:.3f} s")
        if args.out:
            np.savez(args.out, alpha=r.alpha.numpy(), log_alpha=r.log_alpha.numpy(),
                     log_lik=r.log_lik, n_iter=r.n_iter, converged=r.converged,
                     fit_s=fit_s)
            print(f"saved {args.out}")


def _fit_mixture_main(args, local, n_rows, device, rank, world, backend) -> None:
    from .distributed_mixture import fit_mixture_distributed
    t0 = time.perf_counter()
    m = fit_mixture_distributed(local, args.k, n_init=args.n_init, n_screen=args.n_screen,
                                init=args.init, seed=args.seed,
                                kmeans_sample=args.kmeans_sample,
                                tol=1e-6 if args.tol is None else args.tol,
                                max_iter=200 if args.max_iter is None else args.max_iter,
                                batch_size=args.batch_size, device=device, progress=None)
    fit_s = time.perf_counter() - t0
    if rank == 0:
        print(f"world size {world} ({backend}), {n_rows} rows x {local.shape[1]} categories, "
              f"k={args.k}: "
              f"log-likelihood {m.log_lik:.6f}, {m.n_iter} EM iterations "
              f"({m.iter_s * 1e3:.1f} ms each), converged={m.converged}, fit {fit_s:.3f} s")
        if args.out:
            np.savez(args.out, weights=m.weights.numpy(), log_alpha=m.log_alpha.numpy(),
                     log_lik=m.log_lik, n_iter=m.n_iter, converged=m.converged,
                     fit_s=fit_s, iter_s=m.iter_s)
            print(f"saved {args.out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dirmult_ext.distributed",
        description="Fit a Dirichlet-multinomial data-parallel over torchrun ranks.")
    p.add_argument("file", nargs="?", help="counts file (see dirmult_ext.io.load_counts)")
    p.add_argument("--synthetic", action="store_true",
                   help="sample a synthetic DM data set (same on every rank) instead")
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--cols", type=int, default=50)
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the synthetic data and the mixture's starts (default 0)")
    p.add_argument("--k", type=int, default=None,
                   help="fit a mixture of this many components by EM (default: one DM)")
    p.add_argument("--n-init", type=int, default=3,
                   help="mixture: EM runs to convergence, the best kept (default 3)")
    p.add_argument("--n-screen", type=int, default=20,
                   help="mixture: short runs the starts are the best of (default 20; "
                   "at most --n-init: no screening)")
    p.add_argument("--init", choices=["random", "kmeans++"], default="random",
                   help="mixture: starts from responsibilities drawn per row from --seed "
                   "(default), or k-means++ seeds among --kmeans-sample rows")
    p.add_argument("--kmeans-sample", type=int, default=20000,
                   help="mixture: rows gathered to every rank for k-means++ (default 20000)")
    p.add_argument("--method", choices=["newton", "fixed_point"], default="newton")
    p.add_argument("--tol", type=float, default=None,
                   help="relative log-likelihood change to stop at (default 1e-8; mixture 1e-6)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="iterations (default 500; mixture: EM iterations per run, 200)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--device", default="auto", help="auto: cuda:LOCAL_RANK if available")
    p.add_argument("--out", help="rank 0 saves alpha, log_alpha, log_lik, n_iter, converged and "
                   "fit_s (seconds in the fit) to this .npz; a mixture: weights, log_alpha, "
                   "log_lik, n_iter, converged, fit_s and iter_s (seconds per EM iteration)")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if (args.file is None) == (not args.synthetic):
        p.error("give a counts FILE or --synthetic (not both)")
    if args.k is not None and args.method != "newton":
        p.error("--method: the mixture's M-step is Newton's (with the fixed point as fallback)")

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "auto":
        from . import CUDA_KERNELS
        use_cuda = torch.cuda.is_available() and CUDA_KERNELS
        device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                rank=0, world_size=1)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if args.synthetic:
            full = _synthetic(args.rows, args.cols, args.seed)
            n_rows = full.shape[0]
            local = full[shard_rows(full.shape[0], rank, world)]
        elif args.file.endswith(".npy"):
            mm = np.load(args.file, mmap_mode="r", allow_pickle=False)
            if mm.ndim != 2:
                raise ValueError(f"{args.file}: expected a 2-D matrix, got shape {mm.shape}")
            n_rows = mm.shape[0]
            local = torch.from_numpy(np.array(mm[shard_rows(mm.shape[0], rank, world)],
                                              dtype=np.float32))
        else:
            from .io import load_counts
            full = load_counts(args.file)  # (a sparse file stays sparse: its rows' nonzeros)
            n_rows = full.shape[0]
            local = full[shard_rows(full.shape[0], rank, world)]
        if args.k is not None:
            _fit_mixture_main(args, local, n_rows, device, rank, world, backend)
        else:
            _fit_one_main(args, local, device, rank, world, backend)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
