"""Statistics of sparse counts (:class:`~dirmult_ext.sparse.SparseCounts`)
that fitting, the mixture's k-means++ seeding and the distribution read,
computed from the nonzeros only."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .log_lik import log_lik
from ..data import sparse_counts
from ..data.sparse_counts import (SparseCounts, as_sparse_counts, csr_tensor, offset_blocks,
                                  value_rows)

__all__ = ["fit_moments", "row_sq_norms", "sq_distances", "sparse_log_prob"]


def fit_moments(sc: SparseCounts, wb: Tensor, N: Optional[Tensor] = None):
    """The per-batch pieces of fit's prepass from the nonzeros, for row
    weights wb (b, K): N (b,) row totals, the count of bad values, the (K, V)
    weighted sums of the proportions n / N and of their squares (rows with N
    > 0), and c (b,) = log N! - sum_v log n_v!, all float64. Given the row
    totals ``N`` (of an earlier pass), only the moments are computed (the
    count of bad values and c are then None).

    On the CPU each piece goes a block of rows (of columns for the moments)
    at a time, the float64 terms a block's worth beside the matrix (Note
    [Host memory of a sparse fit]); each row's and column's sum is taken in
    the order of its values either way."""
    B, V = sc.shape
    given = N is not None
    if not given:
        N = sc.row_totals()
        bad = torch.zeros((), dtype=torch.int64, device=sc.device)
        lg = torch.empty(B, dtype=torch.float64, device=sc.device)
        for s, e in sc.host_blocks():
            b = sc[s:e]
            v = b.values
            bad += torch.count_nonzero(~torch.isfinite(v)) + torch.count_nonzero(v < 0)
            lg[s:e] = torch.segment_reduce(torch.lgamma(v.double() + 1), "sum",
                                           offsets=b.crow_indices)
    wp = wb * (N > 0).unsqueeze(-1)
    # The column sums as the transpose's product (V, B) @ (B, K), from the
    # column-sorted copy (the one the gradient uses).
    ptr, csc_rows, csc_values = sc.csc()
    inv = N.clamp_min(1e-300)
    block = sparse_counts.ROW_BLOCK_NNZ
    spans = (offset_blocks(ptr, block) if sc.device.type == "cpu" and sc.nnz > block
             else [(0, V)])
    parts = ([], [])
    for v0, v1 in spans:
        j0, j1 = int(ptr[v0]), int(ptr[v1])
        p, r = ptr[v0:v1 + 1] - j0, csc_rows[j0:j1]
        x = csc_values[j0:j1].double() / inv.index_select(0, r)
        for part, values in zip(parts, (x, x * x)):
            Xt = csr_tensor(p, r, values, (v1 - v0, B))
            part.append((Xt @ wp).T if B > 0 else wp.new_zeros(wp.shape[1], v1 - v0))
    sums = [torch.cat(part, 1) if len(part) > 1 else part[0] for part in parts]
    if given:
        return N, None, sums[0], sums[1], None
    return N, bad, sums[0], sums[1], torch.lgamma(N + 1) - lg


def row_sq_norms(x: Tensor) -> Tensor:
    """(b,) |x_b|^2 of the rows of a sparse CSR tensor x. On the CPU each
    row's squares summed as a segment, a block of rows at a time (the same
    order as a row index per value with ``index_add_``, which CUDA takes)."""
    crow, values = x.crow_indices(), x.values()
    if x.device.type != "cpu":
        x2 = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        return x2.index_add_(0, value_rows(crow, values.numel(), crow.dtype), values ** 2)
    x2 = torch.empty(x.shape[0], dtype=x.dtype)
    for s, e in offset_blocks(crow, sparse_counts.ROW_BLOCK_NNZ):
        j0, j1 = int(crow[s]), int(crow[e])
        x2[s:e] = torch.segment_reduce(values[j0:j1] ** 2, "sum", offsets=crow[s:e + 1] - j0)
    return x2


def sq_distances(x: Tensor, centers: Tensor, x2: Optional[Tensor] = None) -> Tensor:
    """(b, K) squared distances between the rows of a sparse CSR tensor x and
    dense centers (K, V): |x|^2 - 2 x . c + |c|^2, clamped at 0. ``x2``:
    :func:`row_sq_norms` of x, where the caller has them."""
    x2 = row_sq_norms(x) if x2 is None else x2
    cross = x @ centers.T
    return (x2.unsqueeze(-1) - 2 * cross + (centers * centers).sum(-1)).clamp_min(0)


def sparse_log_prob(dist, value) -> Tensor:
    """DirichletMultinomial.log_prob of sparse (B, V) counts: the normalized
    pmf of each row, for a distribution of batch_shape () (one concentration
    vector). With the distribution's validate_args, the values must be
    non-negative integers and each row must sum to total_count (if set)."""
    la = dist.log_concentration
    if la.dim() != 1:
        raise ValueError("sparse counts take a DirichletMultinomial of batch_shape () (one "
                         f"concentration vector); this one has batch_shape "
                         f"{tuple(dist.batch_shape)}: index it, or densify the counts")
    sc = as_sparse_counts(value)
    if dist._validate_args:
        v = sc.values
        if not bool(((v >= 0) & (v == v.floor())).all()):
            raise ValueError("the sparse counts must be non-negative integers")
        if dist.total_count is not None and not bool(
                (sc.row_totals() == dist.total_count.double()).all()):
            raise ValueError("each row of the sparse counts must sum to total_count")
    return log_lik(sc, la, normalize=True)
