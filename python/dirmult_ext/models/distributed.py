"""Data-parallel Dirichlet-multinomial fitting with ``torch.distributed``.

Each rank holds a shard of the rows. Every pass over the data computes the
sufficient statistics of :mod:`dirmult_ext.models.engine` on the local shard (weighted
log-likelihood, gradient, trigamma sums q and z, fixed-point denominator,
and in the first pass the moments for the initial value and the row count)
and sums them over ranks with one ``all_reduce`` per pass. Every rank then
holds identical statistics and takes the identical Newton / fixed-point
step, so all ranks end with the same parameters, equal (up to the order of
floating-point summation) to a single-process fit on the concatenated rows.

Backend: ``nccl`` for CUDA devices, ``gloo`` on the CPU.

The launcher is :mod:`dirmult_ext.cli.distributed`.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .fit import DMFit, fit_rows
from ..data.counts import as_counts
from .engine import as_weights, check_common, Rows
from .collective import all_reduce_sum
from ..data.sparse_counts import SparseCounts, as_sparse_counts, is_sparse_input

__all__ = ["fit_distributed", "shard_rows"]


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
    arguments as :func:`dirmult_ext.fit` and equal on every rank. The
    process group must already be initialized. Returns the same
    :class:`~dirmult_ext.DMFit` on every rank (``n_rows`` counts all
    ranks' rows); progress is shown on rank 0 only.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fit_distributed needs an initialized torch.distributed process "
                           "group (torch.distributed.init_process_group)")
    check_common(method, tol, max_iter, min_alpha)
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
    counts = local_counts if local_counts.shape[0] == 0 else as_counts(local_counts)
    w = as_weights(weights, counts.shape[0], dev)
    rows = Rows(counts, w, dev, batch_size)
    show = bool(progress) and dist.get_rank(group) == 0
    return fit_rows(rows, init=init, method=method, tol=tol,
                     gtol=0.01 * math.sqrt(tol) if gtol is None else gtol, max_iter=max_iter,
                     min_alpha=min_alpha, progress=show, reduce=all_reduce_sum(group))
