"""The DM regression output layer (an ``nn.Module``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .data import rows_log_lik


class DirichletMultinomialRegression(nn.Module):
    """A DM output layer: ``log alpha = x @ weight + bias``, ``forward(x,
    counts)`` the per-row log-likelihood ``(B,)`` (use ``-out.mean()`` as
    the loss).

    Args:
        in_features: P; num_categories: V.
        bias: learn a per-category intercept.
        normalize: add the multinomial coefficient to the log-likelihood.
        dtype: the parameters' dtype.

    ``weight`` is ``(P, V)`` (as in ``x @ weight``, the transpose of
    ``nn.Linear``'s), initialized like ``nn.Linear`` (uniform in
    +-1/sqrt(P)); ``bias`` starts at zero. Works under ``torch.compile`` and
    ``torch.jit.script``.
    """

    def __init__(self, in_features: int, num_categories: int, bias: bool = True,
                 normalize: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        if in_features < 1 or num_categories < 2:
            raise ValueError(f"need in_features >= 1 and num_categories >= 2, got "
                             f"{in_features}, {num_categories}")
        self.in_features = in_features
        self.num_categories = num_categories
        self.normalize = normalize
        self.weight = nn.Parameter(torch.empty(in_features, num_categories, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.zeros(num_categories, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    @torch.jit.export
    def log_alpha(self, x: Tensor) -> Tensor:
        """``(B, V)`` log concentrations."""
        out = x @ self.weight
        if self.bias is not None:
            out = out + self.bias
        return out

    @torch.jit.export
    def predict(self, x: Tensor) -> Tensor:
        """``(B, V)`` expected proportions alpha / sum(alpha)."""
        return torch.softmax(self.log_alpha(x), -1)

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError("x's last dimension must equal in_features")
        if counts.shape[-1] != self.num_categories:
            raise ValueError("counts' last dimension must equal num_categories")
        if torch.jit.is_scripting():
            la = self.log_alpha(x)
            if counts.dtype == torch.float64:
                la = la.to(torch.float64)
            return torch.ops.dirmult.log_lik(counts, la, self.normalize)
        return self._eager(x, counts)

    @torch.jit.unused
    def _eager(self, x: Tensor, counts: Tensor) -> Tensor:
        return rows_log_lik(counts, x, self.weight, self.bias, self.normalize)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_categories={self.num_categories}, "
                f"bias={self.bias is not None}, normalize={self.normalize}")
