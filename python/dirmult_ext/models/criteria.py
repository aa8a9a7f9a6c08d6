r"""The Gamma prior of a DM mixture's concentrations and the model-choice
criteria, as Bioconductor's ``DirichletMultinomial::dmn`` defines them
(Holmes, Harris & Quince 2012, "Dirichlet multinomial mixtures", PLoS ONE
7(2): e30126, and the package's ``dirichlet_fit_main.c``).

Prior. ``dmn`` puts a Gamma(shape eta, rate nu) prior on every alpha_kv
(eta = nu = 0.1) and optimizes over lambda = log alpha, so the density
enters in lambda (with the Jacobian d alpha / d lambda = alpha):

    log p(lambda) = eta lambda - nu exp(lambda) + eta log nu - lgamma(eta)

summed over the K V concentrations; there is no prior on the weights.

Criteria, with B samples, V categories, K components, p = K V + K - 1,
log L the mixture log-likelihood (normalized pmf) at pi_k = W_k / B,
W_k = sum_b r_bk:

    NLE     = -(log L + sum_kv log p(lambda_kv))      (no prior: -log L)
    Laplace = NLE + 1/2 log det H - p/2 log(2 pi)
    BIC     = NLE + p/2 log B
    AIC     = NLE + p

BIC and AIC are half the usual -2 log L + ... scale. ``log det H`` is
``dmn``'s: sum_k log |det H_k| + sum_{k >= 2} (2 log B - log W_k) (components
by decreasing weight: the heaviest is left out), where H_k
is the V x V Hessian of the component's negative weighted log posterior

    -[sum_b r_bk log DM(n_b | alpha_k) + sum_v log p(lambda_kv)]

in lambda_k, the responsibilities held fixed. It is a diagonal plus a rank
one matrix (See Note [Trigamma terms]), ``H_k = diag(h_k) + c_k a_k a_k^T``
with a_k = alpha_k, so log |det H_k| = sum_v log |h_kv| + log |1 + c_k
sum_v a_kv^2 / h_kv| (the matrix determinant lemma): O(V) per component, no
dense matrix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["DMN_PRIOR", "GammaPrior", "resolve_prior", "ModelSelection",
           "multinomial_log_lik", "CRITERION_NAMES"]

#: The criteria a model selection chooses k by, as the output names them.
CRITERION_NAMES = {"laplace": "Laplace", "bic": "BIC", "aic": "AIC"}


@dataclass(frozen=True)
class GammaPrior:
    """Gamma(shape, rate) prior on each concentration, in log alpha (module
    docstring)."""
    shape: float
    rate: float

    def log_density(self, eta: Tensor) -> Tensor:
        """(K,) sum over v of log p(lambda_kv) at ``eta`` = lambda (K, V)."""
        const = self.shape * math.log(self.rate) - math.lgamma(self.shape)
        return (self.shape * eta - self.rate * eta.exp() + const).sum(-1)


DMN_PRIOR = GammaPrior(0.1, 0.1)


def resolve_prior(prior) -> Optional[GammaPrior]:
    """``None``/``False``: no prior (the MLE); ``"dmn"``/``True``: dmn's
    Gamma(0.1, 0.1); a ``(shape, rate)`` pair or a :class:`GammaPrior`."""
    if prior is None or prior is False:
        return None
    if prior is True or (isinstance(prior, str) and prior == "dmn"):
        return DMN_PRIOR
    if isinstance(prior, GammaPrior):
        g = prior
    else:
        try:
            shape, rate = prior
            g = GammaPrior(float(shape), float(rate))
        except (TypeError, ValueError):
            raise ValueError(f"prior must be None, 'dmn' or a (shape, rate) pair, got "
                             f"{prior!r}") from None
    if not (g.shape > 0 and g.rate > 0 and math.isfinite(g.shape) and math.isfinite(g.rate)):
        raise ValueError(f"prior shape and rate must be positive and finite, got {g}")
    return g


def add_prior(S, eta: Tensor, prior: Optional[GammaPrior]) -> None:
    """Turn one pass's statistics (``fit._Stats``: L, G, Q, D at ``eta``)
    into those of the penalized objective, in place. The prior adds
    shape - rate alpha to the gradient in lambda and -rate alpha to the
    Hessian's diagonal; since the Newton step builds that diagonal as
    alpha^2 Q + G, Q takes -shape / alpha^2. D takes +rate, which makes the
    fixed-point step alpha (sum_b w_b dpoch(alpha, n_b) + shape / alpha) /
    (D + rate), Minka's update with the prior."""
    if prior is None:
        return
    alpha = eta.exp()
    S.L += prior.log_density(eta)
    S.G += prior.shape - prior.rate * alpha
    if S.Q is not None:
        S.Q -= prior.shape / (alpha * alpha)
    S.D += prior.rate


def hessian_parts(S, eta: Tensor) -> Tuple[Tensor, Tensor]:
    """The negative Hessian in lambda of each component's (penalized,
    ``add_prior`` applied) objective as ``(h (K, V), c (K,))``: H_k =
    diag(h_k) + c_k alpha_k alpha_k^T."""
    alpha = eta.exp()
    return -(alpha * alpha * S.Q + S.G), -S.Z


def log_det_hessian(h: Tensor, c: Tensor, eta: Tensor, W: Tensor, B: int) -> float:
    """dmn's log det H (module docstring) from :func:`hessian_parts`."""
    a2 = eta.exp() ** 2
    per = h.abs().log().sum(-1) + (1 + c * (a2 / h).sum(-1)).abs().log()
    weights = (2 * math.log(B) - W[1:].log()).sum()
    return float(per.sum() + weights)


def criteria(log_lik: float, log_prior: float, log_det: float, K: int, V: int,
             B: int) -> dict:
    """NLE, Laplace, BIC, AIC as dmn reports them (module docstring)."""
    p = K * V + K - 1
    nle = -(log_lik + log_prior)
    return dict(nle=nle, laplace=nle + 0.5 * log_det - 0.5 * p * math.log(2 * math.pi),
                bic=nle + 0.5 * p * math.log(B), aic=nle + p, n_params=p)


_COLUMNS = ("k", "log_lik", "laplace", "bic", "aic")


@dataclass
class ModelSelection:
    """Fits of several K (:func:`dirmult_ext.fit_mixture` with a range of k).

    Attributes:
        fits: the :class:`~dirmult_ext.DMMixture` of each K, in ``ks`` order.
        ks: the numbers of components.
        best_k: K with the lowest Laplace criterion (dmn's choice).
    """
    fits: List = field(repr=False)
    ks: List[int] = field(default_factory=list)

    @property
    def best_k(self) -> int:
        return self.chosen("laplace")

    @property
    def best(self):
        """The fit chosen by the Laplace criterion."""
        return self[self.best_k]

    def chosen(self, criterion: str = "laplace") -> int:
        """K minimizing ``criterion`` (``laplace``, ``bic`` or ``aic``)."""
        if criterion not in ("laplace", "bic", "aic"):
            raise ValueError(f"criterion must be 'laplace', 'bic' or 'aic', got {criterion!r}")
        vals = [getattr(m, criterion) for m in self.fits]
        return self.ks[min(range(len(vals)), key=lambda i: vals[i])]

    def __getitem__(self, k: int):
        if k not in self.ks:
            raise KeyError(f"no fit with k={k} (fitted: {self.ks})")
        return self.fits[self.ks.index(k)]

    def table(self) -> dict:
        """Columns k, log_lik, laplace, bic, aic (lists, one entry per K)."""
        return {c: [int(k) for k in self.ks] if c == "k" else
                [float(getattr(m, c)) for m in self.fits] for c in _COLUMNS}

    def format_table(self) -> str:
        """The table as text, with the K each criterion picks marked."""
        picks = {c: self.chosen(c) for c in ("laplace", "bic", "aic")}
        lines = [f"{'k':>3} {'log-lik':>14} {'Laplace':>14} {'BIC':>14} {'AIC':>14}"]
        for k, m in zip(self.ks, self.fits):
            cells = [f"{m.log_lik:14.2f}"] + [
                f"{getattr(m, c):13.2f}" + ("*" if picks[c] == k else " ")
                for c in ("laplace", "bic", "aic")]
            lines.append(f"{k:>3} " + " ".join(cells))
        lines.append("(* the lowest of each criterion; chosen k by Laplace: "
                     f"{picks['laplace']}, by BIC: {picks['bic']}, by AIC: {picks['aic']})")
        return "\n".join(lines)


#: Counts up to this have their log-factorials summed through a histogram
#: of the counts (one log-gamma per distinct count, not per value).
HISTOGRAM_COUNTS = 1 << 16


def multinomial_log_lik(counts, row_totals: Optional[Tensor] = None) -> float:
    """Log-likelihood (normalized pmf) of a ``(B, V)`` count matrix (tensor
    or :class:`~dirmult_ext.SparseCounts`) under one multinomial at its MLE
    p = column totals / total: sum_b [log N_b! - sum_v log n_bv! + sum_v
    n_bv log p_v], the DM's limit as A = sum(alpha) -> infinity. Rows with
    no counts add 0. ``row_totals``: the N_b (float64), where the caller
    has them already.

    One read of the counts (sparse ones on their device, a block of rows at
    a time on the CPU): the column totals T_v give sum_v T_v log p_v, and
    whole counts up to :data:`HISTOGRAM_COUNTS` their log-factorials through
    a histogram. With whole counts every sum over the values is exact and
    the rest is summed by numpy: the result does not depend on the blocks,
    the device or the thread count."""
    from ..data.sparse_counts import SparseCounts
    B, V = counts.shape
    if isinstance(counts, SparseCounts):
        dev = counts.device
        blocks = ((b.values, b.col_indices, b) for b in
                  (counts[s:e] for s, e in counts.host_blocks()))
    else:
        dev = torch.device("cpu")
        step = max(1, (1 << 20) // max(V, 1))
        blocks = ((c.reshape(-1), None, c) for c in
                  (counts[s:s + step].cpu() for s in range(0, B, step)))
    col_tot = torch.zeros(V, dtype=torch.float64, device=dev)
    hist = torch.zeros(0, dtype=torch.int64, device=dev)
    lg_values = torch.zeros((), dtype=torch.float64, device=dev)
    totals = []
    for vals, cols, block in blocks:
        v = vals.double()
        if cols is None:
            col_tot += block.sum(0, dtype=torch.float64)
        else:
            col_tot.index_add_(0, cols, v)
        if row_totals is None:
            totals.append(block.row_totals() if cols is not None
                          else block.sum(-1, dtype=torch.float64))
        if v.numel() == 0:
            continue
        lo, hi = torch.aminmax(v)
        n = None
        if float(lo) >= 0 and float(hi) <= HISTOGRAM_COUNTS:
            n = vals.to(torch.int32)
            n = n if torch.equal(n.to(vals.dtype), vals) else None
        if n is None:
            lg_values += torch.lgamma(v + 1).sum()
            continue
        h = torch.bincount(n)
        if h.numel() > hist.numel():
            hist = torch.cat([hist, hist.new_zeros(h.numel() - hist.numel())])
        hist[:h.numel()] += h
    N = torch.cat(totals) if row_totals is None else row_totals.to(dev, torch.float64)
    # The sums over rows, columns and distinct counts in numpy's pairwise
    # order: the same on any device and thread count.
    T = col_tot.cpu().numpy()
    total = np.sum(T)
    if total == 0:
        return 0.0
    seen = T[T > 0]
    log_fact = torch.lgamma(torch.arange(hist.numel(), dtype=torch.float64, device=dev) + 1)
    return float(np.sum(torch.lgamma(N + 1).cpu().numpy())
                 - np.sum((hist.double() * log_fact).cpu().numpy()) - float(lg_values)
                 + np.sum(seen * np.log(seen / total)))
