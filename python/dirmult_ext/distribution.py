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
:math:`\mathrm{Var}[n_v] = N \pi_v (1 - \pi_v) (N + A) / (1 + A)` with
:math:`\pi = \alpha / A`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.utils import lazy_property

from .api import log_lik
from .sparse import is_sparse_input
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
            tensor broadcastable to the batch shape (per-row totals). May be
            None when only :meth:`log_prob` is needed (:meth:`sample`,
            :attr:`mean` and :attr:`variance` then raise).
        concentration: ``(..., V)`` positive concentrations alpha; the
            leading dimensions are the batch shape.
        log_concentration: ``(..., V)`` log alpha, instead of
            ``concentration`` (the natural parameter of the ops; pass it to
            keep gradients exact for very small or large alpha).
        validate_args: check the parameters, and in :meth:`log_prob` that the
            value is non-negative integers summing to ``total_count``.

    ``log_prob(value)`` takes ``value`` of shape ``(..., V)`` broadcastable
    against ``batch_shape + (V,)`` and returns the broadcast leading shape,
    in float64 if ``value`` or the concentration is float64, else float32.
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
            tc = torch.as_tensor(total_count, dtype=param.dtype, device=param.device)
            try:
                batch_shape = torch.broadcast_shapes(batch_shape, tc.shape)
            except RuntimeError:
                raise ValueError(f"total_count of shape {tuple(tc.shape)} does not broadcast "
                                 f"with the batch shape {tuple(batch_shape)}") from None
            self.total_count = tc.expand(batch_shape)
        self._param = param
        self._param_name = name
        super().__init__(batch_shape, param.shape[-1:], validate_args=validate_args)

    # -- parameters --------------------------------------------------------
    @lazy_property
    def concentration(self) -> Tensor:
        return self.log_concentration.exp()

    @lazy_property
    def log_concentration(self) -> Tensor:
        return self.concentration.log()

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
    @property
    def mean(self) -> Tensor:
        n = self._require_total("mean")
        alpha = self.concentration.expand(self.batch_shape + self.event_shape)
        return n.unsqueeze(-1) * alpha / alpha.sum(-1, keepdim=True)

    @property
    def variance(self) -> Tensor:
        n = self._require_total("variance").unsqueeze(-1)
        alpha = self.concentration.expand(self.batch_shape + self.event_shape)
        A = alpha.sum(-1, keepdim=True)
        p = alpha / A
        return n * p * (1 - p) * (n + A) / (1 + A)

    # -- torch.distributions plumbing ---------------------------------------
    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(DirichletMultinomial, _instance)
        batch_shape = torch.Size(batch_shape)
        pshape = batch_shape + self.event_shape
        if self._param_name == "concentration":
            new.concentration = self.concentration.expand(pshape)
            new._param = new.concentration
            if "log_concentration" in self.__dict__:
                new.log_concentration = self.log_concentration.expand(pshape)
        else:
            new.log_concentration = self.log_concentration.expand(pshape)
            new._param = new.log_concentration
            if "concentration" in self.__dict__:
                new.concentration = self.concentration.expand(pshape)
        new._param_name = self._param_name
        new.total_count = None if self.total_count is None else self.total_count.expand(batch_shape)
        super(DirichletMultinomial, new).__init__(batch_shape, self.event_shape,
                                                  validate_args=False)
        new._validate_args = self._validate_args
        return new

    # -- log_prob ------------------------------------------------------------
    def log_prob(self, value: Tensor) -> Tensor:
        """Normalized log pmf; ``value`` ``(..., V)`` broadcasting against
        ``batch_shape + (V,)``; returns the broadcast leading shape. Sparse
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
        la = self.log_concentration
        shape = torch.broadcast_shapes(value.shape[:-1], la.shape[:-1])
        value = value.expand(shape + (V,))
        if la.dim() == 1:
            return log_lik(value, la, normalize=True)
        # per-sample concentrations: expand to the value's shape
        la = la.expand(shape + (V,))
        if value.dtype == torch.float64:
            la = la.to(torch.float64)
        return log_lik(value, la, normalize=True)

    # -- sampling ------------------------------------------------------------
    def sample(self, sample_shape=torch.Size()) -> Tensor:
        """Draw ``sample_shape + batch_shape + (V,)`` counts (dtype of the
        concentration): a Dirichlet draw per count vector, then a multinomial
        with that row's ``total_count``."""
        total = self._require_total("sample")
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
            n = total.detach().expand(shape[:-1]).round().to(torch.int64)
            counts = _multinomial_counts(probs.reshape(-1, shape[-1]), n.reshape(-1))
        return counts.reshape(shape).to(self._param.dtype)


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
    left = totals.to(torch.float64)
    tail = probs.flip(-1).cumsum(-1).flip(-1)                             # sum_{u>=v} p_u
    for v in range(V - 1):
        p = torch.where(tail[:, v] > 0, probs[:, v] / tail[:, v], torch.zeros_like(left))
        x = torch.binomial(left, p.clamp(0.0, 1.0))
        out[:, v] = x.to(torch.int64)
        left = left - x
    out[:, V - 1] = left.to(torch.int64)
    return out
