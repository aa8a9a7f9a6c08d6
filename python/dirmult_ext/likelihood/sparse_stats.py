"""Statistics of sparse counts (:class:`~dirmult_ext.sparse.SparseCounts`)
that fitting, the mixture's k-means++ seeding and the distribution read,
computed from the nonzeros only."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .log_lik import log_lik
from ..data.sparse_counts import SparseCounts, csr_tensor, as_sparse_counts, value_rows

__all__ = ["fit_moments", "sq_distances", "sparse_log_prob"]


def fit_moments(sc: SparseCounts, wb: Tensor, N: Optional[Tensor] = None):
    """The per-batch pieces of fit's prepass from the nonzeros, for row
    weights wb (b, K): N (b,) row totals, the count of bad values, the (K, V)
    weighted sums of the proportions n / N and of their squares (rows with N
    > 0), and c (b,) = log N! - sum_v log n_v!, all float64. Given the row
    totals ``N`` (of an earlier pass), only the moments are computed (the
    count of bad values and c are then None)."""
    B, V = sc.shape
    given = N is not None
    if not given:
        rows, cols, c = sc.coo()
        bad = (~torch.isfinite(c)).sum() + (c < 0).sum()
        N = torch.zeros(B, dtype=torch.float64, device=c.device).index_add_(0, rows, c)
    wp = wb * (N > 0).unsqueeze(-1)
    # The column sums as the transpose's product (V, B) @ (B, K), from the
    # column-sorted copy (the one the gradient uses).
    ptr, csc_rows, csc_values = sc.csc()
    x = csc_values.double() / N.clamp_min(1e-300)[csc_rows.long()]
    sums = []
    for values in (x, x * x):
        Xt = csr_tensor(ptr, csc_rows, values, (V, B))
        sums.append((Xt @ wp).T if B > 0 else wp.new_zeros(wp.shape[1], V))
    if given:
        return N, None, sums[0], sums[1], None
    lg = torch.zeros(B, dtype=torch.float64, device=c.device).index_add_(
        0, rows, torch.lgamma(c + 1))
    return N, bad, sums[0], sums[1], torch.lgamma(N + 1) - lg


def sq_distances(x: Tensor, centers: Tensor) -> Tensor:
    """(b, K) squared distances between the rows of a sparse CSR tensor x and
    dense centers (K, V): |x|^2 - 2 x . c + |c|^2, clamped at 0."""
    x2 = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    crow = x.crow_indices()
    x2 = x2.index_add_(0, value_rows(crow, x.values().numel()), x.values() ** 2)
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
