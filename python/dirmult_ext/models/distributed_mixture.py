"""Data-parallel Dirichlet-multinomial mixture fitting (EM) with
``torch.distributed``: :func:`fit_mixture_distributed`.

Each rank holds a contiguous block of the rows. The EM of
:mod:`dirmult_ext.models.mixture` runs on every rank with its sums over rows
(M-step statistics, mixing weights, log-likelihood, the halving test) summed
over ranks by ``all_reduce``, so every rank takes the same steps and ends
with the same parameters, equal up to float64 summation order to
:func:`~dirmult_ext.models.mixture.fit_mixture` on the concatenated rows from the
same start. See Note [Distributed mixture].
"""
from __future__ import annotations

import struct
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from .criteria import resolve_prior
from .collective import all_reduce_sum
from ..data.counts import as_counts
from .engine import Rows, default_progress, prepass
from .progress import progress_bar
from .mixture import DMMixture, best_run, check_mixture_args, mixture_result
from .starts import kmeanspp_centers, nearest_resp, random_responsibilities
from ..data.sparse_counts import SparseCounts, as_sparse_counts, is_sparse_input

__all__ = ["fit_mixture_distributed"]


def _collective_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _raise_together(err: Optional[BaseException], group) -> None:
    """A collective every rank reaches: when any rank's arguments failed,
    every rank raises (that rank its own error, the others a ValueError
    quoting it) instead of the others waiting in the next collective."""
    flag = torch.tensor([0 if err is None else 1], dtype=torch.int64,
                        device=_collective_device(group))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if int(flag[0]) == 0:
        return
    msgs = [None] * dist.get_world_size(group)
    dist.all_gather_object(msgs, None if err is None else str(err), group=group)
    if err is not None:
        raise err
    r = next(i for i, m in enumerate(msgs) if m is not None)
    raise ValueError(f"rank {r} of the group: {msgs[r]}")


def _same_everywhere(named: dict, group) -> None:
    """Raises on every rank, naming the first argument whose value (an int,
    or a float by its bits) differs between ranks."""
    def as_int(v):
        return struct.unpack("<q", struct.pack("<d", v))[0] if isinstance(v, float) else int(v)
    vals = torch.tensor([as_int(v) for v in named.values()], dtype=torch.int64)
    both = torch.cat([vals, -vals]).to(_collective_device(group))
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    both = both.cpu()
    n = len(named)
    for i, (name, v) in enumerate(named.items()):
        if int(both[i]) != int(vals[i]) or -int(both[n + i]) != int(vals[i]):
            raise ValueError(f"{name} must be the same on every rank; this rank has {v!r}")


def _gathered_sample(counts, offset: int, B: int, m: int, seed: int, group):
    """The rows at ``m`` global indices drawn from ``seed`` (every row when
    B <= m), in index order, gathered from their ranks to every rank (on
    the CPU; sparse counts as SparseCounts, dense as a tensor)."""
    if B <= m:
        idx = np.arange(B)
    else:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 2 ** 32])))
        idx = np.sort(rng.choice(B, m, replace=False))
    lo, hi = offset, offset + counts.shape[0]
    mine = torch.from_numpy(idx[(idx >= lo) & (idx < hi)] - lo)
    parts = [None] * dist.get_world_size(group)
    if isinstance(counts, SparseCounts):
        sel = counts[mine.to(counts.device)].to("cpu")
        dist.all_gather_object(parts, (sel.crow_indices.long(), sel.col_indices.long(),
                                       sel.values), group=group)
        crows, base = [torch.zeros(1, dtype=torch.int64)], 0
        for crow, _, _ in parts:
            crows.append(crow[1:] + base)
            base += int(crow[-1])
        return SparseCounts(torch.cat(crows), torch.cat([c for _, c, _ in parts]),
                            torch.cat([v for _, _, v in parts]), (len(idx), counts.shape[1]),
                            validate=False, count_dtype=counts.count_dtype)
    dist.all_gather_object(parts, counts[mine.to(counts.device)].cpu(), group=group)
    return torch.cat(parts)


def _kmeanspp_on_sample(rows: Rows, sample, k: int, seed: int, dev):
    """start(i) of the k-means++ starts: seeds among the sample's rows (the
    same on every rank: one generator from the seed, advanced start after
    start as fit_mixture's), each rank's rows given to the nearest seed."""
    srows = Rows(sample, None, dev, rows.batch_size if rows.batch_size < rows.B else None)
    prepass(srows, check=False)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return lambda i: nearest_resp(rows, kmeanspp_centers(srows, k, gen))


def fit_mixture_distributed(local_counts, k: int, *, n_init: int = 3, n_screen: int = 20,
                            screen_iter: int = 10, max_iter: int = 200, tol: float = 1e-6,
                            seed: Optional[int] = None, init: str = "random",
                            kmeans_sample: int = 20000,
                            m_steps: int = 2, batch_size: Optional[int] = None,
                            min_alpha: float = 1e-6, prior=None,
                            progress: Optional[bool] = False, device=None,
                            group=None) -> DMMixture:
    """Fit a K-component DM mixture to the rows held by all ranks of
    ``group`` (default: the world). Call it on every rank with that rank's
    ``(B_r, V)`` counts (dense, or sparse as :func:`~dirmult_ext.fit`
    takes them; B_r may be 0, V must agree), ranks holding consecutive
    blocks of rows in rank order; every other argument as
    :func:`~dirmult_ext.models.mixture.fit_mixture` and equal on every rank. The
    process group must already be initialized.

    The starts depend on the seed, not on the world size. ``init="random"``
    (default): Dirichlet(1) responsibilities drawn per global row
    (:func:`~dirmult_ext.models.starts.random_responsibilities`), as
    ``fit_mixture(..., init="random", seed=seed)``'s. ``"kmeans++"``: the
    seeds among ``kmeans_sample`` rows drawn from the seed and gathered to
    every rank (all rows when there are no more: then as ``fit_mixture``'s),
    every row given to the nearest seed. ``seed=None``: rank 0 draws one for
    all. Restarts and screening as in ``fit_mixture``.

    Returns the same :class:`~dirmult_ext.models.mixture.DMMixture` on every rank
    except ``responsibilities``, which are this rank's rows'. A bad argument
    on any rank raises on every rank. Progress is shown on rank 0 only.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fit_mixture_distributed needs an initialized torch.distributed "
                           "process group (torch.distributed.init_process_group)")
    rank = dist.get_rank(group)
    err = None
    try:
        check_mixture_args(k, n_init, n_screen, screen_iter, init, m_steps, tol, max_iter,
                            min_alpha)
        if isinstance(kmeans_sample, bool) or not isinstance(kmeans_sample, int) \
                or kmeans_sample < 1:
            raise ValueError(f"kmeans_sample must be a positive integer, got {kmeans_sample!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                                 or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        prior = resolve_prior(prior)
        if is_sparse_input(local_counts):
            local_counts = as_sparse_counts(local_counts)
        elif isinstance(local_counts, np.ndarray):
            local_counts = torch.from_numpy(np.ascontiguousarray(local_counts))
        if not isinstance(local_counts, (Tensor, SparseCounts)) or len(local_counts.shape) != 2:
            raise ValueError("local_counts must be a (rows, categories) matrix")
        counts = local_counts if local_counts.shape[0] == 0 else as_counts(local_counts)
        dev = counts.device if device is None else torch.device(device)
        if dist.get_backend(group) == "nccl" and dev.type != "cuda":
            raise ValueError("device must be 'cuda:<local rank>' with the nccl backend")
    except (ValueError, TypeError) as e:
        err = e
    _raise_together(err, group)
    k = int(k)
    V = counts.shape[1]
    _same_everywhere({"the number of categories (columns)": V, "k": k, "n_init": n_init,
                      "n_screen": n_screen, "screen_iter": screen_iter, "max_iter": max_iter,
                      "m_steps": m_steps, "tol": float(tol), "min_alpha": float(min_alpha),
                      "seed": -1 if seed is None else seed, "kmeans_sample": kmeans_sample,
                      "init (0: random, 1: kmeans++)": int(init == "kmeans++")}, group)
    cdev = _collective_device(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=cdev)
             for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([counts.shape[0]], dtype=torch.int64, device=cdev),
                    group=group)
    sizes = [int(s) for s in sizes]
    offset, B = sum(sizes[:rank]), sum(sizes)
    if B < k:
        raise ValueError(f"k={k} components need at least {k} rows, got {B} on all ranks")
    if seed is None:  # rank 0's draw, for all
        s = torch.tensor([int(torch.seed() % (2 ** 62)) if rank == 0 else 0],
                         dtype=torch.int64, device=cdev)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        seed = int(s[0])

    reduce = all_reduce_sum(group)
    rows = Rows(counts, None, dev, batch_size)
    pre = prepass(rows, reduce)            # validates on all ranks; sets rows.N, rows.c
    if float(pre.Wpos.sum()) <= 0:
        raise ValueError("every row of counts sums to 0: nothing to cluster")
    bar = None
    if rank == 0:
        bar = progress_bar(default_progress(progress, B * V * k * n_init, rows.streaming),
                           n_init * max_iter, "fit_mixture_distributed")
    if init == "kmeans++":
        start = _kmeanspp_on_sample(rows, _gathered_sample(counts, offset, B, kmeans_sample,
                                                           seed, group), k, seed, dev)
    else:
        def start(i):
            return random_responsibilities(offset, offset + rows.B, k, seed, i, dev)
    try:
        best, finals = best_run(
            rows, k, start,
            n_init=n_init, n_screen=n_screen, screen_iter=screen_iter, bar=bar, reduce=reduce,
            max_iter=max_iter, tol=tol, m_steps=m_steps, min_alpha=min_alpha, prior=prior)
    finally:
        if bar is not None:
            bar.close()
    return mixture_result(best, finals, k, V, B, prior, reduce)
