"""The dirmult::log_lik_csr ops over the CSR parts of a (B, V) count matrix
as plain dense tensors (row offsets, column indices, values): their fake
kernels and autograd, the CPU single pass, and the column-sorted copy the
backward reads. See Note [CSR inputs] and Note [CSR gradient].

Gradients: with respect to the concentrations only; the counts are data.
"""
from __future__ import annotations

import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from .dense import SINGLE_PASS_MIN_ROWS_CPU
from .dispatch import eager, is_uniform
from .library import ops

__all__ = ["csc_parts", "csc_parts_in_blocks", "row_of_nonzero", "remember_csc",
           "single_pass_applies", "CsrSinglePass"]


# ------------------------------------------------------- the column-sorted copy
def row_of_nonzero(crow: Tensor, nnz: int) -> Tensor:
    """The row of each stored value (int64): the last row starting at or
    before it (empty rows start where the next row does)."""
    positions = torch.arange(nnz, dtype=crow.dtype, device=crow.device)
    return torch.searchsorted(crow, positions, right=True) - 1


def csc_parts(crow: Tensor, col: Tensor, values: Tensor, V: int,
              rows: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """The column-sorted copy of CSR parts: ``(csc_ptr (V + 1,), csc_rows
    (nnz,), csc_values (nnz,))``, indices in ``crow``'s dtype. A stable sort by
    column keeps each column's rows in increasing order, so the gradient's
    column sums have one order (Note [CSR gradient]). Torch ops only: it
    traces under ``torch.compile`` with a dynamic number of nonzeros.
    ``rows``: the row of each value where the caller has it."""
    if rows is None:
        rows = row_of_nonzero(crow, col.shape[0])
    sorted_col, perm = torch.sort(col, stable=True)
    bounds = torch.arange(V + 1, dtype=col.dtype, device=col.device)
    ptr = torch.searchsorted(sorted_col, bounds)
    del sorted_col
    return ptr.to(crow.dtype), rows.to(crow.dtype)[perm], values[perm]


def csc_parts_in_blocks(crow: Tensor, col: Tensor, values: Tensor, V: int,
                        bounds) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`csc_parts` a block of rows at a time (``bounds``: the row
    ranges ``[(s, e), ...]`` in order): each block's values sorted by column
    (stably) and written at their columns' next free places, so the order is
    the whole sort's (the columns in turn, each column's rows increasing)
    with one block's temporaries beside the copy, not a sort's of the whole."""
    nnz = col.shape[0]
    ptr = torch.zeros(V + 1, dtype=torch.int64, device=col.device)
    ptr[1:] = torch.bincount(col, minlength=V).cumsum(0)
    free = ptr[:-1].clone()                         # each column's next free place
    rows = torch.empty(nnz, dtype=crow.dtype, device=col.device)
    out = torch.empty_like(values)
    for s, e in bounds:
        j0, j1 = int(crow[s]), int(crow[e])
        c = col[j0:j1]
        sorted_col, perm = torch.sort(c, stable=True)
        rank = torch.arange(j1 - j0, device=col.device) - torch.searchsorted(sorted_col,
                                                                              sorted_col)
        at = free.index_select(0, sorted_col) + rank
        del sorted_col, rank
        block_rows = torch.repeat_interleave(
            torch.arange(s, e, dtype=crow.dtype, device=col.device), crow[s:e + 1].diff(),
            output_size=j1 - j0)
        rows[at] = block_rows[perm]
        out[at] = values[j0:j1][perm]
        free += torch.bincount(c, minlength=V)
    return ptr.to(crow.dtype), rows, out


# The column-sorted copy of a prepared matrix (SparseCounts.csc()), by id of
# its col_indices, so that the autograd formula, which sees only the op's
# tensors, reuses it; an entry holds weak references to the parts and goes
# with its owner.
_CSC_CACHE: dict = {}


def remember_csc(owner, crow: Tensor, col: Tensor, values: Tensor, csc) -> None:
    """Keep ``csc`` (csc_parts of these parts) for the backward while
    ``owner`` lives and the values are unchanged."""
    key = id(col)
    _CSC_CACHE[key] = (weakref.ref(crow), weakref.ref(col), weakref.ref(values),
                       values._version, csc)
    weakref.finalize(owner, _CSC_CACHE.pop, key, None)


def _cached_csc(crow: Tensor, col: Tensor, values: Tensor):
    entry = _CSC_CACHE.get(id(col))
    if entry is None:
        return None
    crow_ref, col_ref, val_ref, version, csc = entry
    if (crow_ref() is not crow or col_ref() is not col or val_ref() is not values
            or values._version != version):
        return None
    return csc


def _csc_for(crow: Tensor, col: Tensor, values: Tensor, V: int):
    cached = None if torch.compiler.is_compiling() else _cached_csc(crow, col, values)
    return cached if cached is not None else csc_parts(crow, col, values, V)


# ------------------------------------------------------ fake kernels, autograd
@torch.library.register_fake("dirmult::log_lik_csr")
def _log_lik_csr_fake(crow_indices, col_indices, values, log_alpha, normalize=False):
    B = crow_indices.shape[0] - 1
    shape = (B,) if log_alpha.dim() == 1 else (B, log_alpha.shape[0])
    return log_alpha.new_empty(shape)


@torch.library.register_fake("dirmult::log_lik_csr_backward")
def _log_lik_csr_backward_fake(grad, crow_indices, values, csc_ptr, csc_rows, csc_values,
                               log_alpha):
    return torch.empty_like(log_alpha)


def _csr_setup(ctx, inputs, output):
    crow, col, values, log_alpha, normalize = inputs
    ctx.save_for_backward(crow, col, values, log_alpha)


def _csr_backward(ctx, grad):
    crow, col, values, log_alpha = ctx.saved_tensors
    if ctx.needs_input_grad[2]:
        raise NotImplementedError("dirmult: log_lik_csr has no gradient with respect to the "
                                  "counts' values (only the concentrations')")
    grad_la = None
    if ctx.needs_input_grad[3]:
        ptr, rows, csc_values = _csc_for(crow, col, values, log_alpha.shape[-1])
        grad_la = ops.log_lik_csr_backward.default(grad.contiguous(), crow, values, ptr, rows,
                                                   csc_values, log_alpha)
    return None, None, None, grad_la, None


torch.library.register_autograd("dirmult::log_lik_csr", _csr_backward,
                                setup_context=_csr_setup)


# The single pass (See Note [Single pass]): the rows' log-likelihoods and the
# gradient of their sum from one read of the rows, with no column-sorted
# copy. CPU kernel only (src/cpu/log_lik_csr_with_grad_cpu.cpp).
@torch.library.register_fake("dirmult::log_lik_csr_with_grad")
def _log_lik_csr_with_grad_fake(crow_indices, col_indices, values, log_alpha, normalize=False):
    return log_alpha.new_empty((crow_indices.shape[0] - 1,)), torch.empty_like(log_alpha)


def single_pass_applies(values: Tensor, log_alpha: Tensor, n_rows: int) -> bool:
    """Whether log_lik's eager autograd takes the CPU's single pass: shared
    log_alpha needing a gradient, from as many rows as the dense single pass."""
    return (torch.is_grad_enabled() and log_alpha.requires_grad and log_alpha.dim() == 1
            and not values.requires_grad and values.device.type == "cpu"
            and n_rows >= SINGLE_PASS_MIN_ROWS_CPU and eager())


class CsrSinglePass(torch.autograd.Function):
    """log_lik_csr whose forward also computes the gradient of the rows'
    sum; a backward whose incoming gradient is one number for every row (a
    sum, as its strides show) returns that number times it, any other runs
    the backward op over the column-sorted copy. ``csc``: the matrix's
    ``SparseCounts.csc``, called there, so that the copy is built on the
    first such backward and kept for the next (else built every time)."""

    @staticmethod
    def forward(ctx, crow, col, values, log_alpha, normalize, csc=None):
        out, ctx.grad_of_sum = ops.log_lik_csr_with_grad.default(crow, col, values, log_alpha,
                                                                  normalize)
        ctx.save_for_backward(crow, col, values, log_alpha)
        ctx.csc = csc
        return out

    @staticmethod
    def backward(ctx, grad):
        if is_uniform(grad) and not torch.is_grad_enabled():
            return None, None, None, ctx.grad_of_sum * grad.reshape(-1)[0], None, None
        if ctx.csc is not None:
            ctx.csc()  # (kept by its owner, where _csr_backward's lookup finds it)
        return _csr_backward(ctx, grad) + (None,)
