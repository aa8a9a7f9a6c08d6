"""``DirichletMultinomial`` for Pyro models: the package's distribution with
Pyro's ``TorchDistributionMixin`` (``pyro.sample`` without ``obs``,
broadcasting inside ``pyro.plate``, ``expand_by``, ``to_event``, ``mask``),
``log_prob`` on the fused dirmult ops.

Needs Pyro (``pip install pyro-ppl``); ``import dirmult_ext`` does not.
"""
from __future__ import annotations

import torch

try:
    from pyro.distributions.torch_distribution import TorchDistributionMixin
    from pyro.distributions.util import broadcast_shape
except ImportError as e:
    raise ImportError("dirmult_ext.pyro needs Pyro: install it with `pip install pyro-ppl`"
                      ) from e

from ..likelihood import distribution as _base

__all__ = ["DirichletMultinomial"]


class DirichletMultinomial(_base.DirichletMultinomial, TorchDistributionMixin):
    r"""Dirichlet-multinomial distribution for Pyro; the arguments of
    :class:`dirmult_ext.DirichletMultinomial` (``total_count`` first, then
    ``concentration`` or ``log_concentration``; pass them by keyword to
    swap in for ``pyro.distributions.DirichletMultinomial``, whose order is
    ``concentration, total_count``). Unlike Pyro's, rows may have different
    totals when sampling.
    """

    @staticmethod
    def infer_shapes(total_count=(), concentration=None, log_concentration=None):
        param = concentration if concentration is not None else log_concentration
        if param is None:
            raise ValueError("infer_shapes needs the shape of concentration or "
                             "log_concentration")
        batch_shape = broadcast_shape(tuple(param[:-1]), tuple(total_count or ()))
        return torch.Size(batch_shape), torch.Size(param[-1:])
