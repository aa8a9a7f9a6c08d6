"""Maximum-likelihood fitting of one Dirichlet-multinomial: :func:`fit` and
its result, :class:`DMFit`. The objective, the updates and the convergence
test are described in :mod:`.engine`, which runs them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from torch import Tensor

from ..data.threads import fit_threads
from ..data.counts import as_counts
from .engine import (Reducer, Rows, as_weights, check_common, default_progress,
                     identity, init_eta, optimize, prepass, resolve_device)

__all__ = ["fit", "DMFit", "fit_rows"]


@dataclass
class DMFit:
    """Result of :func:`fit`.

    Attributes:
        alpha: ``(V,)`` float64 fitted concentrations (on the CPU).
        log_alpha: ``(V,)`` float64, ``log(alpha)``.
        log_lik: final total (weighted) log-likelihood, normalized pmf.
        log_lik_trace: the log-likelihood at the start and after each iteration.
        n_iter: iterations taken.
        converged: whether the tolerance was met within ``max_iter``.
        method: ``"newton"`` or ``"fixed_point"``.
        grad_norm: final ``max_v |alpha_v g_v| / sum_b w_b`` (projected).
        n_rows: number of rows fitted (all ranks, for a distributed fit).
    """
    alpha: Tensor
    log_alpha: Tensor
    log_lik: float
    log_lik_trace: List[float] = field(repr=False)
    n_iter: int
    converged: bool
    method: str
    grad_norm: float = float("nan")
    n_rows: int = 0

    @property
    def precision(self) -> float:
        """A = sum_v alpha_v (larger: less overdispersed than multinomial)."""
        return float(self.alpha.sum())

    def distribution(self, total_count=None):
        """The fitted :class:`~dirmult_ext.likelihood.distribution.DirichletMultinomial`."""
        from ..likelihood.distribution import DirichletMultinomial
        return DirichletMultinomial(total_count, log_concentration=self.log_alpha)


def fit_rows(rows: Rows, *, init, method, tol, gtol, max_iter, min_alpha, progress,
              reduce: Reducer = identity) -> DMFit:
    pre = prepass(rows, reduce)
    if float(pre.Wpos.sum()) <= 0:
        raise ValueError("the rows with a positive total have zero total weight (all-zero "
                         "counts or weights): nothing to fit")
    eta0 = init_eta(init, pre, rows.V, rows.device, min_alpha)
    prog = default_progress(progress, pre.B * rows.V, rows.streaming)
    eta, S, trace, n_iter, conv, gnorm = optimize(
        rows, eta0, pre, method=method, tol=tol, gtol=gtol, max_iter=max_iter,
        min_alpha=min_alpha, reduce=reduce, progress=prog)
    la = eta[0].detach().cpu()
    return DMFit(alpha=la.exp(), log_alpha=la, log_lik=float(trace[-1][0]),
                 log_lik_trace=[float(x[0]) for x in trace], n_iter=n_iter,
                 converged=bool(conv[0]), method=method, grad_norm=float(gnorm[0]),
                 n_rows=pre.B)


def fit(counts, *, init=None, method: str = "newton", tol: float = 1e-8,
        max_iter: int = 500, batch_size: Optional[int] = None, weights=None,
        progress: Optional[bool] = None, device=None, min_alpha: float = 1e-10,
        gtol: Optional[float] = None) -> DMFit:
    """Maximum-likelihood Dirichlet-multinomial concentrations for a count matrix.

    Args:
        counts: ``(B, V)`` non-negative counts (torch tensor or numpy array;
            float32/float64 or integer; or sparse: a SparseCounts, torch or
            scipy sparse matrix). Rows with zero total contribute nothing.
            Stays where it is when streaming.
        init: starting concentrations ``(V,)`` (positive), or None /
            ``"moments"`` for the method-of-moments estimate.
        method: ``"newton"`` (default; diagonal-plus-rank-one Hessian, with
            step halving and fixed-point fallback) or ``"fixed_point"``
            (Minka's fixed-point iteration).
        tol: relative log-likelihood change for convergence; ``gtol``
            (default ``0.01 * sqrt(tol)``) bounds the per-row gradient with respect
            to log_alpha (see the module docstring).
        max_iter: maximum number of iterations.
        batch_size: visit the rows in batches of this many, each moved to
            ``device`` in turn (streaming; from host memory to CUDA through
            two pinned staging buffers of one batch each, the next batch's
            copy overlapping the current one's compute). Default: all at
            once, unless the device is CUDA, the counts are on the CPU and
            their bytes (dense: numel x element size; sparse: the CSR parts)
            exceed half of ``torch.cuda.mem_get_info()``'s free memory: then
            streamed in batches of average rows taking at most 1/16 of it.
        weights: ``(B,)`` non-negative row weights (default ones).
        progress: report the iterations on stderr (a tqdm bar, or plain
            lines without tqdm): True from the start, False never, None
            (default) on a terminal once the fit has taken 2 s (from the
            start when the rows are streamed).
        device: where to compute; default ``counts.device``.
        min_alpha: lower bound for the concentrations (categories never
            observed have their MLE at 0).

    Returns:
        :class:`DMFit` with float64 CPU tensors.
    """
    check_common(method, tol, max_iter, min_alpha)
    counts = as_counts(counts)
    dev = resolve_device(counts, device)
    w = as_weights(weights, counts.shape[0], dev)
    rows = Rows(counts, w, dev, batch_size)
    with fit_threads(counts.shape[0] * counts.shape[1], dev):  # See Note [Fit threads]
        return fit_rows(rows, init=init, method=method, tol=tol,
                         gtol=0.01 * math.sqrt(tol) if gtol is None else gtol,
                         max_iter=max_iter, min_alpha=min_alpha, progress=progress)
