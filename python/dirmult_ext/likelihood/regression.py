"""The public DM regression: per-row concentrations from covariates,
``log_alpha = X @ W + bias``, inside one op."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..ops import checks
from ..ops.regression import call_log_lik_regression
from .log_lik import reduce_rows


def log_lik_regression(counts: Tensor, X: Tensor, W: Tensor, bias: Optional[Tensor] = None, *,
                       normalize: bool = False, reduction: str = "none") -> Tensor:
    r"""Dirichlet-multinomial log-likelihood of each row of ``counts`` under
    its own concentrations ``log_alpha[b] = X[b] @ W + bias``.

    .. math::
        \log p(n_b \mid \alpha_b) = \sum_v \mathrm{lnpoch}(\alpha_{bv}, n_{bv})
        - \mathrm{lnpoch}(A_b, N_b) \;[+\; \log N_b! - \textstyle\sum_v \log n_{bv}!]

    with :math:`A_b = \sum_v \alpha_{bv}` (zero counts included) and
    :math:`N_b = \sum_v n_{bv}`. The ``(B, V)`` concentrations are computed
    inside the kernels and never stored.

    Args:
        counts: ``(B, V)`` dense counts (dtypes as :func:`log_lik`). Sparse
            counts are not taken: densify them first.
        X: ``(B, P)`` covariates.
        W: ``(P, V)`` coefficients.
        bias: ``(V,)`` intercepts, or None.
        normalize: add the multinomial coefficient.
        reduction: ``"none"``, ``"sum"`` or ``"mean"`` over the rows.

    Returns:
        ``(B,)`` log-likelihoods (reduced by ``reduction``), float64 if any
        of counts, X, W, bias is float64, else float32.

    Differentiable with respect to ``X``, ``W`` and ``bias``; not with
    respect to ``counts`` (a backward that needs it raises
    ``NotImplementedError``). The reductions of the gradients over the rows
    are in a fixed order: the same bits run to run, for any thread count.
    """
    checks.reduction(reduction)
    checks.regression_inputs(counts, X, W, bias)
    wide = (counts.dtype == torch.float64 or X.dtype == torch.float64
            or W.dtype == torch.float64 or (bias is not None and bias.dtype == torch.float64))
    dtype = torch.float64 if wide else torch.float32
    if X.dtype != dtype:
        X = X.to(dtype)
    if W.dtype != dtype:
        W = W.to(dtype)
    if bias is not None and bias.dtype != dtype:
        bias = bias.to(dtype)
    return reduce_rows(call_log_lik_regression(counts, X, W, bias, normalize), reduction)
