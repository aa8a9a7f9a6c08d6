"""Collectives shared by the data-parallel fits: each pass's statistics
summed over ranks."""
from __future__ import annotations

import torch.distributed as dist
from torch import Tensor

__all__ = ["all_reduce_sum"]


def all_reduce_sum(group):
    """A reducer (a function of one tensor) that sums it over ``group``'s ranks."""
    def reduce(t: Tensor) -> Tensor:
        t = t.contiguous()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t
    return reduce
