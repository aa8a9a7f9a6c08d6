"""The user-facing functions and module over the dirmult ops."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..data.sparse_counts import is_sparse_input
from ..ops import checks
from . import sparse
from ..ops.dense import call_log_lik
from ..ops.components import call_log_lik_components

COUNT_DTYPES = checks.COUNT_DTYPES
REDUCTIONS = checks.REDUCTIONS


def _compute_dtype(counts: Tensor, log_alpha: Tensor) -> torch.dtype:
    if counts.dtype == torch.float64 or log_alpha.dtype == torch.float64:
        return torch.float64
    return torch.float32


def reduce_rows(out: Tensor, reduction: str) -> Tensor:
    """The rows' sum or mean. The mean is the sum divided by the row count,
    not out.mean(): mean's backward hands every row grad / n as a dense
    tensor, which the single pass does not see as uniform."""
    if reduction == "sum":
        return out.sum()
    if reduction == "mean":
        return out.sum() / out.numel()
    return out


def log_lik(counts: Tensor, log_alpha: Optional[Tensor] = None, *,
            alpha: Optional[Tensor] = None, normalize: bool = False,
            validate: bool = False, reduction: str = "none") -> Tensor:
    r"""Dirichlet-multinomial log-likelihood of count vectors.

    .. math::
        \log p(n \mid \alpha) = \sum_v \mathrm{lnpoch}(\alpha_v, n_v) - \mathrm{lnpoch}(A, N)
        \;[+\; \log N! - \textstyle\sum_v \log n_v!]

    with :math:`\mathrm{lnpoch}(a, n) = \log\Gamma(a+n) - \log\Gamma(a)`,
    :math:`A = \sum_v \alpha_v`, :math:`N = \sum_v n_v`. The bracketed
    multinomial coefficient is added when ``normalize=True`` (the normalized
    pmf); without it the value is the likelihood of one ordered sequence.

    Args:
        counts: ``(..., V)`` counts; float32/float64/float16/bfloat16 or
            int32/int64/uint8. Non-integer counts use the Gamma-function
            extension. Any leading batch shape, including none and zero-size.
            Or sparse ``(B, V)`` counts with a shared ``(V,)`` log_alpha: a
            torch sparse CSR/CSC/COO tensor, a ``scipy.sparse`` matrix or a
            :class:`dirmult_ext.SparseCounts` (``dirmult_ext.sparse``).
        log_alpha: log-concentrations, ``(V,)`` shared by all rows or of
            ``counts``' shape (one concentration vector per row).
        alpha: the concentrations themselves, instead of ``log_alpha``.
        normalize: add the multinomial coefficient.
        validate: raise ``ValueError`` on negative or non-finite counts or
            non-finite concentrations (synchronizes with the device). Without
            it such a row's result is NaN (non-finite shared ``log_alpha``
            makes every row NaN).
        reduction: ``"none"`` (the rows' log-likelihoods), ``"sum"`` or
            ``"mean"`` over them (a 0-d tensor; the mean of no rows is NaN).
            ``"mean"`` is the sum divided by the number of rows, so that its
            gradient reaches the op as one number for every row: it takes
            the single pass below, where ``out.mean()`` would not.

    Returns:
        ``counts.shape[:-1]`` log-likelihoods (reduced by ``reduction``),
        float64 if ``counts`` or the concentration is float64, else float32
        (float16/bfloat16/integer counts are computed in float32).

    Differentiable with respect to ``log_alpha``/``alpha`` and to floating
    ``counts``. When only a shared ``log_alpha`` needs the gradient (eager
    mode; on CUDA float32 from one row, on CPU from 64), the forward also
    computes the gradient of the rows' sum in the same read of the counts,
    and a backward of ``out.sum()`` (or ``-out.sum()``, ``out.sum() / n``)
    costs only a scaling (so does ``reduction="mean"``); ``out.mean()`` and
    weighted sums take the regular backward. Rows whose incoming gradient is
    exactly 0 do not enter the gradient of shared or component
    concentrations (their bad counts do not make it NaN; on CUDA, runs of 8
    such rows are not even read).

    Composes with ``torch.func`` (``grad``, ``jacrev``, ``jacfwd``, ``jvp``,
    ``hessian``, ``vmap`` of them) and ``torch.autograd.forward_ad``: first
    and second derivatives with respect to ``log_alpha`` in either mode, for
    dense and sparse counts (a torch sparse tensor is closed over, not
    vmapped); first derivatives with respect to floating ``counts``. A
    third derivative raises ``NotImplementedError``.
    """
    if (log_alpha is None) == (alpha is None):
        raise ValueError("pass exactly one of log_alpha and alpha")
    checks.reduction(reduction)
    if is_sparse_input(counts):
        return reduce_rows(sparse.log_lik(counts, log_alpha, alpha, normalize=normalize,
                                       validate=validate), reduction)
    name = "log_alpha"
    if alpha is not None:
        checks.inputs(counts, alpha, "alpha")
        name = "alpha"
        if validate:
            checks.positive(alpha)
        log_alpha = alpha.log()
    checks.inputs(counts, log_alpha, name)
    checks.log_lik_shapes(counts, log_alpha, name)
    dtype = _compute_dtype(counts, log_alpha)
    if log_alpha.dtype != dtype:  # (a no-op .to() still costs a dispatch)
        log_alpha = log_alpha.to(dtype)
    if validate:
        checks.finite(counts, log_alpha, name)
    return reduce_rows(call_log_lik(counts, log_alpha, normalize), reduction)


def log_lik_components(counts: Tensor, log_alpha: Tensor, *,
                       normalize: bool = False) -> Tensor:
    r"""Log-likelihood of every row of ``counts`` under each of K components.

    Args:
        counts: ``(B, V)`` counts (dtypes as :func:`log_lik`), dense or
            sparse (the forms :func:`log_lik` takes).
        log_alpha: ``(K, V)`` log-concentrations, one row per component.
        normalize: add the multinomial coefficient.

    Returns:
        ``(B, K)``: ``out[b, k] = log_lik(counts[b], log_alpha[k])``.
        Differentiable with respect to ``log_alpha``. On CUDA, short rows
        and many components take one pass over the counts per block of
        components; long rows and few components take ``log_lik``'s kernels
        once per component (whichever the measured cost model predicts is
        faster; then column k is ``log_lik``'s bits). The environment
        variable ``DIRMULT_CUDA_COMPONENTS=fused`` or ``=per_component``,
        set before import, forces one way for float32. On CPU, always the
        latter.
    """
    if is_sparse_input(counts):
        return sparse.log_lik_components(counts, log_alpha, normalize=normalize)
    checks.inputs(counts, log_alpha)
    checks.components_shapes(counts, log_alpha)
    log_alpha = log_alpha.to(_compute_dtype(counts, log_alpha))
    return call_log_lik_components(counts, log_alpha, normalize)


class DirichletMultinomialLogLik(nn.Module):
    """Holds ``log_alpha`` (V,) as a parameter; ``forward(counts)`` returns
    the per-row DM log-likelihood ``log_lik(counts, self.log_alpha)``.

    A drop-in for a module that computes the same quantity with lgamma
    differences (``reference_log_lik``): the same values to float32
    accuracy, from one fused op. Works with ``torch.compile`` and
    ``torch.export``, and is scriptable with ``torch.jit.script``.

    Args:
        num_categories: V.
        init_log_alpha: initial value (V,), default zeros (alpha = 1).
        normalize: add the multinomial coefficient.
        reduction: ``"none"``, ``"sum"`` or ``"mean"`` over the rows, as in
            ``log_lik`` (``"mean"`` takes the single pass; ``.mean()`` of
            the rows does not).
    """

    def __init__(self, num_categories: int, init_log_alpha: Optional[Tensor] = None,
                 normalize: bool = False, dtype: torch.dtype = torch.float32,
                 reduction: str = "none"):
        super().__init__()
        checks.reduction(reduction)
        self.reduction = reduction
        if init_log_alpha is None:
            init_log_alpha = torch.zeros(num_categories, dtype=dtype)
        if init_log_alpha.shape != (num_categories,):
            raise ValueError(f"init_log_alpha must have shape ({num_categories},), "
                             f"got {tuple(init_log_alpha.shape)}")
        self.log_alpha = nn.Parameter(init_log_alpha.detach().clone().to(dtype))
        self.normalize = normalize

    def forward(self, counts: Tensor) -> Tensor:
        if counts.shape[-1] != self.log_alpha.shape[0]:
            raise ValueError("counts' last dimension must equal num_categories")
        la = self.log_alpha
        if counts.dtype == torch.float64:
            la = la.to(torch.float64)
        if torch.jit.is_scripting():
            out = torch.ops.dirmult.log_lik(counts, la, self.normalize)
        else:
            out = self._eager_log_lik(counts, la)
        return reduce_rows(out, self.reduction)

    @torch.jit.unused
    def _eager_log_lik(self, counts: Tensor, la: Tensor) -> Tensor:
        if is_sparse_input(counts):
            return sparse.log_lik(counts, la, normalize=self.normalize)
        return call_log_lik(counts, la, self.normalize)

    def extra_repr(self) -> str:
        extra = f", reduction={self.reduction!r}" if self.reduction != "none" else ""
        return f"num_categories={self.log_alpha.shape[0]}, normalize={self.normalize}{extra}"


def reference_log_lik(counts: Tensor, log_alpha: Tensor, normalize: bool = False) -> Tensor:
    """The plain-PyTorch formula (lgamma differences), as users write it:
    ``lgamma(A) - lgamma(N + A) + sum_v (lgamma(n_v + alpha_v) - lgamma(alpha_v))``
    (plus ``lgamma(N + 1) - sum_v lgamma(n_v + 1)`` with ``normalize``).

    Used as the benchmark peer and, in float64, as a reference in tests. In
    float32 it subtracts two large lgammas and loses accuracy for large
    concentrations or counts: ``lgamma(1e6 + 1) - lgamma(1e6)`` comes out
    13.0 instead of 13.82 (6% off), and a gradient term
    ``alpha * (digamma(alpha + n) - digamma(alpha))`` at alpha = 1e7 is
    100% off. ``log_lik`` never forms that difference.
    """
    alpha = log_alpha.exp()
    if alpha.dim() == 1:
        alpha = alpha.expand_as(counts)
    counts = counts.to(alpha.dtype)
    A = alpha.sum(-1)
    N = counts.sum(-1)
    out = (torch.lgamma(A) - torch.lgamma(N + A)
           + (torch.lgamma(counts + alpha) - torch.lgamma(alpha)).sum(-1))
    if normalize:
        out = out + torch.lgamma(N + 1) - torch.lgamma(counts + 1).sum(-1)
    return out
