"""Starting points of the mixture's EM runs (Note [Mixture restarts]):
k-means++ seeds on the row proportions, turned into softened one-hot
responsibilities, and Dirichlet(1, ..., 1) random responsibilities keyed by
row index (so that a shard of the rows draws its slice of the whole
matrix's draws)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..data.sparse_counts import SparseCounts
from ..likelihood.sparse_stats import row_sq_norms, sq_distances
from .engine import Rows

__all__ = ["kmeanspp", "kmeanspp_centers", "nearest_resp", "random_responsibilities"]


def _props(rows: Rows, cb, s: int, e: int):
    """Proportions n / N of the batch ``cb`` (rows [s, e), on the device; a
    sparse CSR tensor for sparse rows: distances from the nonzeros)."""
    if isinstance(cb, SparseCounts):
        return cb.proportions(rows.N[s:e])
    return cb.to(torch.float64) / rows.N[s:e].clamp_min(1e-300).unsqueeze(-1)


def _row_props(rows: Rows, s: int, e: int):
    """:func:`_props` of rows [s, e), moved to the device."""
    return _props(rows, rows.counts[s:e].to(rows.device), s, e)


def _prop_batches(rows: Rows):
    """``(s, e, proportions, squared norms or None)`` of each batch, the
    norms for sparse rows. Rows of one batch (not streamed) are made into
    proportions once, for all the passes of one seeding; streamed ones on
    every pass."""
    def made(s, e, cb):
        x = _props(rows, cb, s, e)
        return s, e, x, (row_sq_norms(x) if rows.sparse else None)

    if not rows.streaming:
        one = [made(*b) for b in rows.count_batches()]
        return lambda: one
    return lambda: (made(*b) for b in rows.count_batches())


def kmeanspp_centers(rows: Rows, k: int, gen: torch.Generator, batches=None) -> Tensor:
    """k-means++ seeds among the row proportions n / N (rows with N > 0),
    (k, V) float64 dense. ``batches``: the rows' :func:`_prop_batches`, where
    the caller has them."""
    dev, B = rows.device, rows.B
    sparse_rows = rows.sparse

    def seed_props(s):
        x = _row_props(rows, s, s + 1)
        return x.to_dense() if sparse_rows else x

    valid = (rows.N > 0).to(torch.float64)
    if float(valid.sum()) == 0:
        raise ValueError("every row of counts sums to 0: nothing to cluster")
    first = int(torch.multinomial(valid.cpu(), 1, generator=gen))
    centers = seed_props(first)
    d2 = torch.full((B,), float("inf"), dtype=torch.float64, device=dev)
    batches = batches or (_prop_batches(rows) if k > 1 else None)
    for _ in range(1, k):
        for s, e, x, x2 in batches():
            dist = (sq_distances(x, centers[-1:], x2)[:, 0] if sparse_rows
                    else ((x - centers[-1]) ** 2).sum(-1))
            d2[s:e] = torch.minimum(d2[s:e], dist)
        p = (d2 * valid).clamp_min(0)
        p = p if float(p.sum()) > 0 else valid
        nxt = int(torch.multinomial(p.cpu(), 1, generator=gen))
        centers = torch.cat([centers, seed_props(nxt)])
    return centers


def nearest_resp(rows: Rows, centers: Tensor, batches=None) -> Tensor:
    """One-hot responsibilities to the nearest center, softened (0.9 on the
    center's component, the rest spread), (B, K) float64."""
    k = centers.shape[0]
    centers = centers.to(rows.device)
    R = torch.empty(rows.B, k, dtype=torch.float64, device=rows.device)
    for s, e, x, x2 in (batches or _prop_batches(rows))():
        nearest = (sq_distances(x, centers, x2) if rows.sparse
                   else torch.cdist(x, centers)).argmin(-1)
        R[s:e] = torch.nn.functional.one_hot(nearest, k).to(torch.float64)
    return 0.9 * R + 0.1 / k if k > 1 else R


def kmeanspp(rows: Rows, k: int, gen: torch.Generator) -> Tensor:
    """k-means++ seeding on the row proportions; the responsibilities of
    :func:`nearest_resp`."""
    batches = _prop_batches(rows)
    return nearest_resp(rows, kmeanspp_centers(rows, k, gen, batches), batches)


_RESP_BLOCK = 4096      # rows per generator of the random starts


def random_responsibilities(start: int, stop: int, k: int, seed: int, stream: int = 0,
                            device=None) -> Tensor:
    """Dirichlet(1, ..., 1) responsibilities (normalized Exp(1) draws) of
    the rows ``[start, stop)`` of a matrix, (stop - start, k) float64. Each
    block of 4096 rows draws from its own generator keyed by (seed, stream,
    block), so a row's draw depends only on its index: a shard of the rows
    gets the slice of the whole matrix's draws (Note [Distributed mixture])."""
    draws = []
    for b in range(start // _RESP_BLOCK, -(-stop // _RESP_BLOCK)):
        rng = np.random.Generator(np.random.PCG64(
            np.random.SeedSequence([int(seed) % 2 ** 64, int(stream), b])))
        g = rng.standard_exponential((_RESP_BLOCK, k))
        o = b * _RESP_BLOCK
        draws.append(g[max(start, o) - o:min(stop, o + _RESP_BLOCK) - o])
    g = np.concatenate(draws) if draws else np.zeros((0, k))
    return torch.from_numpy(g / g.sum(-1, keepdims=True)).to(device)
