r"""``DirichletMultinomial``: a ``torch.distributions.Distribution`` over count
vectors whose ``log_prob`` runs on the fused dirmult ops.

For concentration :math:`\alpha \in \mathbb{R}_{>0}^V`, :math:`A = \sum_v \alpha_v`
and a count vector :math:`n` with total :math:`N = \sum_v n_v`:

.. math::
    \log p(n \mid \alpha, N) = \log N! - \sum_v \log n_v!
        + \log\Gamma(A) - \log\Gamma(N + A)
        + \sum_v [\log\Gamma(n_v + \alpha_v) - \log\Gamma(\alpha_v)]

Sampling: :math:`p \sim \mathrm{Dirichlet}(\alpha)`, then
:math:`n \sim \mathrm{Multinomial}(N, p)`. Moments:
:math:`E[n_v] = N \alpha_v / A`,
:math:`\mathrm{Cov}[n] = N \frac{N + A}{1 + A} (\mathrm{diag}(\pi) - \pi \pi^T)` with
:math:`\pi = \alpha / A` (its diagonal is the variance).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.utils import lazy_property

from .log_lik import log_lik
from ..data.sparse_counts import is_sparse_input
from .sparse_stats import sparse_log_prob

__all__ = ["DirichletMultinomial", "MultinomialCounts"]

# Above this many categorical draws (rows x largest total) sampling switches
# from torch.multinomial + scatter to sequential binomial stick-breaking.
_CATEGORICAL_DRAW_LIMIT = 1 << 24


class MultinomialCounts(constraints.Constraint):
    """Support of a count-vector distribution: non-negative integers along
    the last dimension, summing to ``total_count`` (any total when
    ``total_count`` is None). ``check(value)`` returns ``value.shape[:-1]``
    booleans."""

    is_discrete = True
    event_dim = 1

    def __init__(self, total_count: Optional[Tensor] = None):
        self.total_count = total_count
        super().__init__()

    def check(self, value: Tensor) -> Tensor:
        ok = ((value >= 0) & (value == value.floor())).all(-1) if value.is_floating_point() \
            else (value >= 0).all(-1)
        if self.total_count is not None:
            ok = ok & (value.sum(-1) == self.total_count)
        return ok

    def __repr__(self) -> str:
        what = "any total" if self.total_count is None else "total_count"
        return f"{self.__class__.__name__}(non-negative integers summing to {what})"


class DirichletMultinomial(Distribution):
    r"""Dirichlet-multinomial (Polya, DCM) distribution over count vectors.

    Args:
        total_count: number of trials N; a non-negative integer scalar or a
            tensor broadcastable to the batch shape (per-row totals), kept
            as an int64 tensor (exact as far as int64 goes). May be
            None when only :meth:`log_prob` is needed (:meth:`sample` and
            the moments then raise).
        concentration: ``(..., V)`` positive concentrations alpha; the
            batch shape is its leading dimensions broadcast with
            ``total_count``'s shape.
        log_concentration: ``(..., V)`` log alpha, instead of
            ``concentration`` (the natural parameter of the ops; pass it to
            keep gradients exact for very small or large alpha).
        validate_args: check the parameters, and in :meth:`log_prob` that the
            value is non-negative integers summing to ``total_count``.

    ``log_prob(value)`` takes ``value`` of shape ``(..., V)`` broadcastable
    against ``batch_shape + (V,)`` and returns ``sample_shape + batch_shape``
    (the broadcast of ``value.shape[:-1]`` and ``batch_shape``), in float64 if ``value`` or the concentration is float64, else float32.
    It is differentiable with respect to the concentration.
    """

    has_rsample = False
    has_enumerate_support = False

    def __init__(self, total_count=None, concentration: Optional[Tensor] = None, *,
                 log_concentration: Optional[Tensor] = None,
                 validate_args: Optional[bool] = None):
        if (concentration is None) == (log_concentration is None):
            raise ValueError("pass exactly one of concentration and log_concentration")
        param = concentration if concentration is not None else log_concentration
        name = "concentration" if concentration is not None else "log_concentration"
        if not isinstance(param, Tensor):
            param = torch.as_tensor(param, dtype=torch.get_default_dtype())
        if not param.is_floating_point():
            param = param.to(torch.get_default_dtype())
        if param.dim() < 1 or param.shape[-1] < 1:
            raise ValueError(f"{name} must have shape (..., V) with V >= 1, "
                             f"got {tuple(param.shape)}")
        if concentration is not None:
            self.concentration = param
        else:
            self.log_concentration = param
        batch_shape = param.shape[:-1]
        if total_count is None:
            self.total_count = None
        else:
            tc = _as_total_count(total_count, param.device)
            try:
                batch_shape = torch.broadcast_shapes(batch_shape, tc.shape)
            except RuntimeError:
                raise ValueError(f"total_count of shape {tuple(tc.shape)} does not broadcast "
                                 f"with the batch shape {tuple(batch_shape)}") from None
            self.total_count = tc.expand(batch_shape)
        self._param = param
        self._param_name = name
        super().__init__(batch_shape, param.shape[-1:], validate_args=validate_args)
        # The constraints (real, positive) admit +-inf, which is no concentration.
        if self._validate_args and not bool(torch.isfinite(param).all()):
            bad = float(param[~torch.isfinite(param)].flatten()[0])
            raise ValueError(f"{name} must be finite, got a value of {bad} (alpha = exp of "
                             "log_concentration must be a finite positive number)")

    # -- parameters --------------------------------------------------------
    @lazy_property
    def concentration(self) -> Tensor:
        # See Note [Broadcast concentration]
        la = self.log_concentration
        return _unbroadcast(la).exp().expand(la.shape)

    @lazy_property
    def log_concentration(self) -> Tensor:
        c = self.concentration
        return _unbroadcast(c).log().expand(c.shape)

    @property
    def arg_constraints(self):
        cons = {}
        if self._param_name == "concentration":
            cons["concentration"] = constraints.independent(constraints.positive, 1)
        else:
            cons["log_concentration"] = constraints.independent(constraints.real, 1)
        if self.total_count is not None:
            cons["total_count"] = constraints.nonnegative_integer
        return cons

    @property
    def support(self) -> MultinomialCounts:
        return MultinomialCounts(self.total_count)

    @property
    def param_shape(self) -> torch.Size:
        return self._param.shape

    def _require_total(self, what: str) -> Tensor:
        if self.total_count is None:
            raise ValueError(f"DirichletMultinomial.{what} needs total_count; construct the "
                             "distribution with total_count=N")
        return self.total_count

    # -- moments -------------------------------------------------------------
    def _probs(self) -> Tuple[Tensor, Tensor]:
        # (alpha / A, A), of batch_shape + (V,) and batch_shape + (1,)
        alpha = self.concentration.expand(self.batch_shape + self.event_shape)
        A = alpha.sum(-1, keepdim=True)
        return alpha / A, A

    @property
    def mean(self) -> Tensor:
        n = self._require_total("mean").unsqueeze(-1)
        p, _ = self._probs()
        return n * p

    @property
    def variance(self) -> Tensor:
        n = self._require_total("variance").unsqueeze(-1)
        p, A = self._probs()
        return n * p * (1 - p) * (n + A) / (1 + A)

    @property
    def covariance_matrix(self) -> Tensor:
        """``batch_shape + (V, V)``: ``N (N + A) / (1 + A) (diag(p) - p p^T)``,
        ``p = alpha / A``."""
        n = self._require_total("covariance_matrix")[..., None, None]
        p, A = self._probs()
        A = A.unsqueeze(-1)
        outer = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
        return n * (n + A) / (1 + A) * outer

    # -- what the distribution does not offer ---------------------------------
    def rsample(self, sample_shape=torch.Size()) -> Tensor:
        raise NotImplementedError(
            "DirichletMultinomial.rsample is not implemented: the counts are discrete, so a "
            "draw has no reparametrized gradient; use sample() (with a score-function "
            "estimator for gradients of expectations)")

    def entropy(self) -> Tensor:
        raise NotImplementedError(
            "DirichletMultinomial.entropy is not implemented: it has no closed form and the "
            "exact sum runs over all C(N + V - 1, V - 1) count vectors; estimate it as "
            "-log_prob(sample((S,))).mean(0)")

    def enumerate_support(self, expand: bool = True) -> Tensor:
        raise NotImplementedError(
            "DirichletMultinomial.enumerate_support is not implemented: the support has "
            "C(N + V - 1, V - 1) count vectors, too many to enumerate but for tiny N and V")

    def cdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(
            "DirichletMultinomial.cdf is not implemented: count vectors have no total order, "
            "so there is no cumulative distribution function")

    def icdf(self, value: Tensor) -> Tensor:
        raise NotImplementedError(
            "DirichletMultinomial.icdf is not implemented: count vectors have no total "
            "order, so there is no inverse cumulative distribution function")

    # -- torch.distributions plumbing ---------------------------------------
    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(DirichletMultinomial, _instance)
        batch_shape = torch.Size(batch_shape)
        pshape = batch_shape + self.event_shape
        # Both parametrizations from the unexpanded ones: an expanded view
        # keeps its stride-0 dimensions (See Note [Broadcast concentration]).
        new.concentration = self.concentration.expand(pshape)
        new.log_concentration = self.log_concentration.expand(pshape)
        new._param = getattr(new, self._param_name)
        new._param_name = self._param_name
        new.total_count = None if self.total_count is None else self.total_count.expand(batch_shape)
        super(DirichletMultinomial, new).__init__(batch_shape, self.event_shape,
                                                  validate_args=False)
        new._validate_args = self._validate_args
        return new

    # -- log_prob ------------------------------------------------------------
    def log_prob(self, value: Tensor) -> Tensor:
        """Normalized log pmf of ``value`` ``(..., V)``, broadcasting against
        ``batch_shape + (V,)``; returns
        ``broadcast_shapes(value.shape[:-1], batch_shape)``. The pmf does not
        read ``total_count`` (a value's total is its own sum); with
        ``validate_args`` a value whose total differs is rejected. Sparse
        ``(B, V)`` counts (see :func:`dirmult_ext.log_lik`) take a
        distribution of batch_shape ``()`` and return ``(B,)``."""
        if is_sparse_input(value):
            return sparse_log_prob(self, value)
        if not isinstance(value, Tensor):
            value = torch.as_tensor(value)
        if self._validate_args:
            self._validate_sample(value)
        V = self.event_shape[0]
        if value.dim() < 1 or value.shape[-1] != V:
            raise ValueError(f"value must have shape (..., {V}), got {tuple(value.shape)}")
        try:
            shape = torch.broadcast_shapes(value.shape[:-1], self.batch_shape)
        except RuntimeError:
            raise ValueError(f"value of shape {tuple(value.shape)} does not broadcast with "
                             f"batch_shape + event_shape "
                             f"{tuple(self.batch_shape + self.event_shape)}") from None
        # See Note [Broadcast concentration]
        la = _unbroadcast(self.log_concentration)
        if all(s == 1 for s in la.shape[:-1]):
            out = log_lik(value, la.reshape(V), normalize=True)
        else:
            rows = torch.broadcast_shapes(value.shape[:-1], la.shape[:-1]) + (V,)
            out = log_lik(value.expand(rows), la.expand(rows), normalize=True)
        return out if out.shape == shape else out.expand(shape)

    # -- sampling ------------------------------------------------------------
    def sample(self, sample_shape=torch.Size()) -> Tensor:
        """Draw ``sample_shape + batch_shape + (V,)`` counts: a Dirichlet
        draw per count vector, then a multinomial with that row's
        ``total_count``. The counts are drawn as int64 and sum exactly to
        ``total_count``; they are returned in the concentration's dtype
        where it holds every total exactly (float32: totals up to 2^24), else
        in float64 (up to 2^53), else as int64.

        Raises:
            ValueError: a ``total_count`` that is not a non-negative integer
                (NaN, infinite, negative or fractional; reachable with
                ``validate_args=False``).
        """
        total = self._require_total("sample")
        if total.is_floating_point():
            bad = ~((total >= 0) & (total < 2.0 ** 63) & (total == total.floor()))
        else:
            bad = total < 0
        if bool(bad.any()):
            raise ValueError("DirichletMultinomial.sample needs total_count to be a "
                             f"non-negative integer, got {float(total[bad].flatten()[0])}")
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            alpha = self.concentration.detach().to(torch.float64).expand(shape)
            gam = torch._standard_gamma(alpha.contiguous())
            s = gam.sum(-1, keepdim=True)
            # All gammas can underflow to 0 for tiny alpha: put the mass on the
            # largest concentration (the limit of the Dirichlet draw).
            dead = (s <= 0).squeeze(-1)
            if bool(dead.any()):
                gam[dead] = torch.nn.functional.one_hot(
                    alpha[dead].argmax(-1), shape[-1]).to(gam.dtype)
                s = gam.sum(-1, keepdim=True)
            probs = gam / s
            n = total.detach().expand(shape[:-1]).to(torch.int64)
            counts = _multinomial_counts(probs.reshape(-1, shape[-1]), n.reshape(-1))
        return counts.reshape(shape).to(_exact_dtype(self._param.dtype, n))


def _as_total_count(total_count, device) -> Tensor:
    """``total_count`` as int64 where it is integer-valued (exact as far as
    int64 goes: a float32 tensor would round 2^24 + 1 to 2^24), else as
    float64 (NaN, infinite, negative or fractional totals: rejected by the
    validation and by :meth:`DirichletMultinomial.sample`)."""
    if isinstance(total_count, Tensor):
        tc = total_count.to(device)
    else:
        tc = torch.as_tensor(total_count, device=device)
    if not tc.is_floating_point():
        return tc.to(torch.int64)
    tc = tc.to(torch.float64)
    if bool((torch.isfinite(tc) & (tc == tc.floor()) & (tc.abs() < 2.0 ** 63)).all()):
        return tc.to(torch.int64)
    return tc


def _exact_dtype(dtype: torch.dtype, totals: Tensor) -> torch.dtype:
    """``dtype`` if it represents every integer up to the largest total,
    else float64, else int64."""
    top = int(totals.max()) if totals.numel() else 0
    for dt in (dtype, torch.float64):
        if dt.is_floating_point and top <= 2 / torch.finfo(dt).eps:
            return dt
    return torch.int64


def _unbroadcast(t: Tensor) -> Tensor:
    """``t`` with each leading dimension of stride 0 cut to size 1 (a view).
    See Note [Broadcast concentration]."""
    if t.dim() < 2:
        return t
    idx = tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride()[:-1])
    return t[idx]


def _multinomial_counts(probs: Tensor, totals: Tensor, method: Optional[str] = None) -> Tensor:
    """One multinomial draw per row: ``probs`` (R, V) float64 rows summing to
    1, ``totals`` (R,) int64. Returns (R, V) int64 counts.

    ``method="categorical"``: ``max(totals)`` categorical draws per row
    (``torch.multinomial``), those past the row's total masked, counted with
    a scatter-add. ``method="binomial"``: stick-breaking, ``n_v ~
    Binomial(N - sum_{u<v} n_u, p_v / sum_{u>=v} p_u)`` for v = 0..V-2.
    Default: categorical unless it needs more than 2^24 draws.
    """
    R, V = probs.shape
    out = torch.zeros(R, V, dtype=torch.int64, device=probs.device)
    if R == 0 or V == 0:
        return out
    nmax = int(totals.max())
    if nmax == 0:
        return out
    if method is None:
        method = "categorical" if R * nmax <= _CATEGORICAL_DRAW_LIMIT else "binomial"
    if method == "categorical":
        draws = torch.multinomial(probs, nmax, replacement=True)          # (R, nmax)
        keep = torch.arange(nmax, device=probs.device) < totals.unsqueeze(-1)
        out.scatter_add_(1, draws, keep.to(torch.int64))
        return out
    if method != "binomial":
        raise ValueError(f"method must be 'categorical' or 'binomial', got {method!r}")
    # The remainder is kept in int64: above 2^53 a float64 one would drift.
    left = totals.clone()
    tail = probs.flip(-1).cumsum(-1).flip(-1)                             # sum_{u>=v} p_u
    for v in range(V - 1):
        p = torch.where(tail[:, v] > 0, probs[:, v] / tail[:, v], torch.zeros_like(probs[:, v]))
        x = torch.binomial(left.to(torch.float64), p.clamp(0.0, 1.0)).to(torch.int64)
        x = torch.minimum(x.clamp_min(0), left)
        out[:, v] = x
        left = left - x
    out[:, V - 1] = left
    return out
