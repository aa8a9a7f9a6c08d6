"""The public functions' path for sparse counts: ``log_lik`` and
``log_lik_components`` of a :class:`~dirmult_ext.data.sparse_counts.SparseCounts`,
a torch sparse tensor or a ``scipy.sparse`` matrix, unpacked into the CSR ops'
dense parts."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..data.sparse_counts import MAX_CUDA_COMPONENTS, SparseCounts, as_sparse_counts
from ..ops import transforms
from ..ops.csr import CsrSinglePass, single_pass_applies
from ..ops import checks
from ..ops.dispatch import is_transform_wrapped, outside_transforms, transforms_active
from ..ops.library import ops

__all__ = ["log_lik", "log_lik_components"]


def _as_sparse_counts(counts, validate: bool) -> SparseCounts:
    if not transforms_active():
        return as_sparse_counts(counts, validate=True if validate else None)
    # A torch sparse tensor closed over by a torch.func transform: converted
    # (and its column-sorted copy built) with the transforms' layers off,
    # which cannot read a sparse layout; the parts enter the op as constants.
    if is_transform_wrapped(counts):
        raise NotImplementedError(
            "dirmult: sparse counts cannot be batched or differentiated by torch.func "
            "(torch.vmap over a batch of sparse tensors is not supported): close over one "
            "sparse matrix and vmap over log_alpha, or pass the rows dense to vmap over them")
    with outside_transforms():
        sc = as_sparse_counts(counts, validate=True if validate else None)
        sc.csc()
    return sc


def _prepare(counts, log_alpha: Tensor, name: str, validate: bool) -> Tuple[SparseCounts, Tensor]:
    sc = _as_sparse_counts(counts, validate)
    if not isinstance(log_alpha, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(log_alpha).__name__}")
    if not log_alpha.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {log_alpha.dtype}")
    if log_alpha.device != sc.device:
        raise ValueError(f"counts and {name} must be on the same device, got {sc.device} and "
                         f"{log_alpha.device}")
    dtype = torch.float64 if torch.float64 in (sc.count_dtype, log_alpha.dtype) \
        else torch.float32
    if log_alpha.dtype != dtype:
        log_alpha = log_alpha.to(dtype)
    if validate:
        if not bool(torch.isfinite(sc.values).all()):
            raise ValueError("counts contains NaN or infinite values")
        if bool((sc.values < 0).any()):
            raise ValueError("counts contains negative values")
        if not bool(torch.isfinite(log_alpha).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
    return sc, log_alpha


def _keep_csc(sc: SparseCounts, log_alpha: Tensor) -> None:
    if torch.is_grad_enabled() and log_alpha.requires_grad and not torch.compiler.is_compiling():
        sc.csc()  # (built once and kept on sc: the backward finds it, Note [CSR gradient])


def log_lik(counts, log_alpha: Optional[Tensor] = None, alpha: Optional[Tensor] = None, *,
            normalize: bool = False, validate: bool = False) -> Tensor:
    """:func:`dirmult_ext.log_lik` for sparse counts (``(B,)``, unreduced):
    ``log_alpha`` must be shared, ``(V,)``. With ``validate`` the structure
    is checked on any device, and bad values raise as in the dense path."""
    name = "log_alpha" if alpha is None else "alpha"
    if alpha is not None:
        if not isinstance(alpha, Tensor):
            raise TypeError(f"alpha must be a torch.Tensor, got {type(alpha).__name__}")
        if validate:
            checks.positive(alpha)
        log_alpha = alpha.log()
    sc, log_alpha = _prepare(counts, log_alpha, name, validate)
    B, V = sc.shape
    if log_alpha.dim() != 1 or log_alpha.shape[0] != V:
        raise ValueError(
            f"with sparse counts {name} must be shared, shape ({V},); got "
            f"{tuple(log_alpha.shape)}. Per-sample (B, V) concentrations take dense counts; "
            "(K, V) components take log_lik_components")
    if transforms_active():
        return transforms.log_lik_csr(sc.crow_indices, sc.col_indices, sc.values, log_alpha,
                                      normalize, sc.csc())
    if single_pass_applies(sc.values, log_alpha, sc.shape[0]):
        return CsrSinglePass.apply(sc.crow_indices, sc.col_indices, sc.values, log_alpha,
                                    normalize, sc.csc)
    _keep_csc(sc, log_alpha)
    return ops.log_lik_csr(sc.crow_indices, sc.col_indices, sc.values, log_alpha, normalize)


def log_lik_components(counts, log_alpha: Tensor, *, normalize: bool = False,
                       validate: bool = False) -> Tensor:
    """:func:`dirmult_ext.log_lik_components` for sparse counts: ``(B, K)``."""
    sc, log_alpha = _prepare(counts, log_alpha, "log_alpha", validate)
    B, V = sc.shape
    if log_alpha.dim() != 2 or log_alpha.shape[1] != V:
        raise ValueError(f"log_alpha must be (K, {V}), got {tuple(log_alpha.shape)}")
    if log_alpha.is_cuda and log_alpha.shape[0] > MAX_CUDA_COMPONENTS:
        raise ValueError(f"with sparse counts on CUDA, log_alpha may have at most "
                         f"{MAX_CUDA_COMPONENTS} components, got {log_alpha.shape[0]}")
    if transforms_active():
        return transforms.log_lik_csr(sc.crow_indices, sc.col_indices, sc.values, log_alpha,
                                      normalize, sc.csc())
    _keep_csc(sc, log_alpha)
    return ops.log_lik_csr(sc.crow_indices, sc.col_indices, sc.values, log_alpha, normalize)
