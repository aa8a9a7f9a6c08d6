"""DM regression's data: the covariates and counts as the fit reads them
(checked, standardized, in row batches), the one likelihood function, and
the passes over the rows that the optimizers and the standard errors share.
"""
from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np
import torch
from torch import Tensor

from ...likelihood.log_lik import log_lik
from ...ops.library import ops
from ...likelihood.regression import log_lik_regression


INTERCEPT = "(intercept)"
PENALTIES = (None, "l2", "group_lasso")

Reducer = Callable[[Tensor], Tensor]


def identity(t: Tensor) -> Tensor:
    return t


def rows_log_lik(counts: Tensor, X: Tensor, W: Tensor, bias: Optional[Tensor],
                  normalize: bool) -> Tensor:
    """Per-row DM log-likelihood (B,) with log alpha = X @ W + bias;
    differentiable with respect to X, W and bias. The one place the
    regression computes the likelihood: the op on the CPU (fused there); on
    CUDA ``X @ W + bias`` then the per-sample ``log_lik``, the composition
    the op runs there (Note [Regression fusion])."""
    if not counts.is_cuda:
        return log_lik_regression(counts, X, W, bias, normalize=normalize)
    eta = X @ W
    if bias is not None:
        eta = eta + bias
    return log_lik(counts, eta, normalize=normalize)


def as_covariates(X, B: Optional[int], P: Optional[int] = None, name: str = "X") -> Tensor:
    if isinstance(X, np.ndarray):
        if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
            raise TypeError(f"{name} must be numeric, got a numpy array of dtype {X.dtype} "
                            "(encode categorical covariates as 0/1 columns)")
        X = torch.from_numpy(np.ascontiguousarray(X))
    if not isinstance(X, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(X).__name__}")
    if X.is_complex():
        raise TypeError(f"{name} must be real, got {X.dtype}")
    if X.dim() == 1:
        X = X.unsqueeze(-1)
    if X.dim() != 2:
        raise ValueError(f"{name} must be a (rows, covariates) matrix, got shape "
                         f"{tuple(X.shape)}")
    if B is not None and X.shape[0] != B:
        raise ValueError(f"{name} has {X.shape[0]} rows but counts has {B}: one row of "
                         "covariates per row (sample) of counts; counts read from a taxa x "
                         "samples file need samples_in_columns=True in "
                         "dirmult_ext.io.load_counts (--samples-in-columns)")
    if P is not None and X.shape[1] != P:
        raise ValueError(f"{name} has {X.shape[1]} columns, the fit {P} covariates")
    X = X.to(torch.float64)
    bad = ~torch.isfinite(X)
    if bool(bad.any()):
        i, j = (int(t) for t in bad.nonzero()[0])
        raise ValueError(f"{name} must be finite: {float(X[i, j])} at row {i + 1}, column {j + 1} "
                         f"(1-based; {int(bad.sum())} in all)")
    return X


def as_dense_counts(counts):
    """A (B, V) counts tensor, or SparseCounts (densified a batch at a time)."""
    from ...data.counts import as_counts
    return as_counts(counts)


def column_names(names, n: int, what: str, default_prefix: str) -> List[str]:
    if names is None:
        return [f"{default_prefix}{i + 1}" for i in range(n)]
    names = [str(s) for s in names]
    if len(names) != n:
        raise ValueError(f"{what} has {len(names)} names for {n} columns")
    return names


class RegressionData:
    """Rows of counts (B, V) with standardized covariates (B, P) and row
    weights, visited in batches on ``device``."""

    def __init__(self, counts, X: Tensor, weights: Optional[Tensor], device,
                 batch_size: Optional[int]):
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.device = device
        self.B, self.V = counts.shape
        self.P = X.shape[1]
        self.streaming = batch_size is not None and batch_size < self.B
        self.batch_size = batch_size if batch_size is not None else max(self.B, 1)
        self.counts = counts if batch_size is not None else counts.to(device)
        self.X = X if batch_size is not None else X.to(device)
        self.weights = weights
        self.mu = torch.zeros(self.P, dtype=torch.float64, device=device)
        self.scale = torch.ones(self.P, dtype=torch.float64, device=device)
        self._Xs = None
        self._cache = {}

    def set_standardization(self, mu: Tensor, scale: Tensor) -> None:
        self.mu, self.scale = mu.to(self.device), scale.to(self.device)
        if not self.streaming:
            self._Xs = (self.X - self.mu) / self.scale

    def batches(self, standardized: bool = True):
        """Yield (index, counts (b, V) dense on device, X (b, P) float64, w (b,) or None)."""
        from ...data.sparse_counts import SparseCounts
        for i, s in enumerate(range(0, self.B, self.batch_size)):
            e = min(s + self.batch_size, self.B)
            cb = self.counts[s:e].to(self.device, non_blocking=True)
            if isinstance(cb, SparseCounts):
                cb = cb.to_dense()
            if standardized and self._Xs is not None:
                xb = self._Xs[s:e]
            else:
                xb = self.X[s:e].to(self.device, torch.float64)
                if standardized:
                    xb = (xb - self.mu) / self.scale
            wb = None if self.weights is None else self.weights[s:e].to(self.device)
            yield i, cb, xb, wb


def design_prepass(data: RegressionData, reduce: Reducer):
    """Counts checked; totals: row count, weight, the normalizing constant,
    covariate sums and squares."""
    dev, P = data.device, data.P
    acc = torch.zeros(5 + 2 * P, dtype=torch.float64, device=dev)
    for _, cb, xb, wb in data.batches(standardized=False):
        c = cb.to(torch.float64)
        bad = (~torch.isfinite(c)).sum() + (c < 0).sum()
        N = c.sum(-1)
        const = torch.lgamma(N + 1) - torch.lgamma(c + 1).sum(-1)
        w = torch.ones_like(N) if wb is None else wb
        acc += torch.cat([torch.stack([bad.to(torch.float64),
                                       torch.tensor(float(c.shape[0]), dtype=torch.float64,
                                                    device=dev),
                                       w.sum(), (w * const).sum(), (w * (N > 0)).sum()]),
                          xb.sum(0), (xb * xb).sum(0)])
    acc = reduce(acc)
    if float(acc[0]) > 0:
        raise ValueError("counts must be finite and non-negative")
    n, wsum, C = float(acc[1]), float(acc[2]), float(acc[3])
    if float(acc[4]) <= 0:
        raise ValueError("counts: no row with a positive total and a positive weight: "
                         "nothing to fit")
    return n, wsum, C, acc[5:5 + P], acc[5 + P:]


def dm_row_terms(cb: Tensor, eta: Tensor):
    """Per-row Hessian of the DM log-likelihood with respect to log alpha:
    H_b = diag(d_b) + c_b a_b a_b^T (See Note [Regression standard errors]),
    from the fused trigamma terms (See Note [Trigamma terms]):
    d = dadpoch(a, n) - (a / A) adpoch(A, N), c = -a2tpoch(A, N) / A^2."""
    n = cb.to(torch.float64)
    eta = eta.contiguous()
    a = eta.exp()
    log_A = torch.logsumexp(eta, -1)
    A = log_A.exp()
    _, dad = ops.tpoch_terms(eta, n)
    a2t_row, dad_row = ops.tpoch_terms(log_A, n.sum(-1))
    d = dad - (a / A.unsqueeze(-1)) * (dad_row - a2t_row).unsqueeze(-1)
    c = -a2t_row / (A * A)
    return a, d, c


def augment(xb: Tensor, has_bias: bool) -> Tensor:
    if not has_bias:
        return xb
    return torch.cat([xb, torch.ones(xb.shape[0], 1, dtype=xb.dtype, device=xb.device)], 1)


