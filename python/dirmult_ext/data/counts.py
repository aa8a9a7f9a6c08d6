"""Counts as the fits read them (:func:`as_counts`): a dense tensor in a
dtype the kernels take, a :class:`~.sparse_counts.SparseCounts`, or a
:class:`RowSource`, read a block at a time.

Count matrices that stay where they are stored: :class:`RowSource`, rows
read a block at a time on request (from a file, a database, a backed
AnnData), never the whole matrix at once.

The fits (:func:`~dirmult_ext.fit`, :func:`~dirmult_ext.fit_mixture`,
:func:`~dirmult_ext.fit_regression`) take a RowSource wherever they take
counts: they then always stream (``batch_size`` defaults to the source's
``block_rows``), asking for ``source[s:e]`` once per block and pass, and for
single rows when the mixture seeds its starts (k-means++). Every pass over
the rows reads the matrix once more, so a source on disk trades time for
memory; the rows' totals and the fit's (B, K) weights are held in memory.
Blocks are read on the calling thread and moved to the device with
``.to(device)`` (no pinned staging: Note [Row streaming] covers tensors in
host memory).

A subclass gives ``shape``, ``sparse`` and :meth:`RowSource.read`; see
``dirmult_ext.integrations.anndata`` for one over ``h5py`` and anndata's
backed matrices.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
from torch import Tensor

from .sparse_counts import as_sparse_counts, is_sparse_input

__all__ = ["as_counts", "RowSource"]


def as_counts(counts) -> Tensor:
    if isinstance(counts, RowSource):  # (read a block at a time: streamed)
        if len(counts.shape) != 2 or counts.shape[1] < 2:
            raise ValueError(f"counts needs at least 2 categories (columns), got shape "
                             f"{tuple(counts.shape)}")
        return counts
    if is_sparse_input(counts):  # (kept sparse: every pass reads the nonzeros only)
        counts = as_sparse_counts(counts)
        if counts.shape[1] < 2:
            raise ValueError(f"counts needs at least 2 categories (columns), got {counts.shape[1]}")
        return counts
    if isinstance(counts, np.ndarray):
        counts = torch.from_numpy(np.ascontiguousarray(counts))
    if not isinstance(counts, Tensor):
        raise TypeError(f"counts must be a torch.Tensor or numpy array, "
                        f"got {type(counts).__name__}")
    if counts.dim() != 2:
        raise ValueError(f"counts must be a (rows, categories) matrix, got shape "
                         f"{tuple(counts.shape)}")
    if counts.shape[1] < 2:
        raise ValueError(f"counts needs at least 2 categories (columns), got {counts.shape[1]}")
    if counts.dtype == torch.bool:
        counts = counts.to(torch.uint8)
    if counts.is_floating_point() and counts.dtype not in (torch.float32, torch.float64):
        counts = counts.to(torch.float32)
    if counts.dtype in (torch.int8, torch.int16):
        counts = counts.to(torch.int32)
    return counts


__all__ = ["RowSource", "DEFAULT_BLOCK_BYTES"]

#: Default block size of a source, in bytes of the rows as read (dense: rows
#: x columns x element size; sparse: nonzeros x 12 for a value and index).
DEFAULT_BLOCK_BYTES = 64 << 20


class RowSource:
    """Rows of a ``(B, V)`` count matrix, read in blocks.

    Subclasses set ``shape`` (B, V) and ``sparse`` (whether blocks come as
    sparse matrices, which the fits then keep sparse) and implement
    :meth:`read`. ``block_rows`` (default: blocks of about
    :data:`DEFAULT_BLOCK_BYTES`, from :meth:`row_bytes`) is the batch size
    a fit uses when it is given none.
    """

    shape: Tuple[int, int]
    sparse: bool = False
    #: where blocks are made (they are moved to the fit's device after)
    device = torch.device("cpu")

    def read(self, start: int, stop: int):
        """Rows ``[start, stop)``: a NumPy array, a ``scipy.sparse`` matrix,
        a torch tensor or a :class:`~dirmult_ext.SparseCounts`."""
        raise NotImplementedError

    def row_bytes(self) -> float:
        """Average bytes of a row as read (sets the default ``block_rows``)."""
        return 4.0 * self.shape[1]

    @property
    def block_rows(self) -> int:
        return int(max(1, min(max(self.shape[0], 1),
                              DEFAULT_BLOCK_BYTES // max(self.row_bytes(), 1.0))))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice):
        """Rows ``s:e`` as the fits read counts: a dense tensor (float32,
        float64 or integer) or a SparseCounts."""
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError(f"{type(self).__name__} takes row slices s:e (step 1)")
        s, e, _ = rows.indices(self.shape[0])
        block = as_counts(self.read(s, max(s, e)))
        if tuple(block.shape) != (max(e - s, 0), self.shape[1]):
            raise ValueError(f"{type(self).__name__}.read({s}, {e}) returned shape "
                             f"{tuple(block.shape)}, expected ({e - s}, {self.shape[1]})")
        return block

    def to(self, device, non_blocking: bool = False):
        raise TypeError(f"a {type(self).__name__} is read a block at a time; "
                        "it cannot be moved to a device as a whole")
