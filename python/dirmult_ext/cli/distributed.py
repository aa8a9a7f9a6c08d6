"""The launcher of the data-parallel fits (:func:`dirmult_ext.models.distributed.fit_distributed`
and :func:`dirmult_ext.models.distributed_mixture.fit_mixture_distributed`).

Launch (one process per GPU)::

    torchrun --nproc_per_node=2 -m dirmult_ext.cli.distributed counts.npy --out params.npz
    torchrun --nproc_per_node=2 -m dirmult_ext.cli.distributed --synthetic --rows 100000

Each rank reads the file (``.npy`` files are memory-mapped) and keeps rows
``[rank * B // world, (rank + 1) * B // world)``. Without torchrun's
environment it runs as a single process (world size 1). With ``--k K`` it
fits a K-component mixture instead
::

    torchrun --nproc_per_node=2 -m dirmult_ext.cli.distributed counts.npz --k 10 --n-init 1
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from ..models.distributed import fit_distributed, shard_rows

__all__ = ["main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _synthetic(rows: int, cols: int, seed: int) -> Tensor:
    from ..likelihood.distribution import DirichletMultinomial
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
    from ..models.distributed_mixture import fit_mixture_distributed
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
        prog="python -m dirmult_ext.cli.distributed",
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
        from ..ops.library import CUDA_KERNELS
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
            from ..data.io import load_counts
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
