"""Row blocks of a count matrix, delivered on the compute device:
:func:`stream_rows` (its one job), :func:`auto_batch_size` (when to stream
without being asked, and in blocks of what size) and :func:`matrix_bytes`.

From host memory to a CUDA device each block goes through a pinned staging
buffer and is copied on a stream of its own while the previous block is
computed on; anywhere else a block is the row slice,
moved with ``.to(device)`` (on the CPU: the slice itself).

Memory: two pinned staging buffers of one block each (one when there is a
single block); the matrix itself is never pinned (that would hold a second
copy of it). See Note [Row streaming].
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from .counts import RowSource
from .sparse_counts import SparseCounts

__all__ = ["stream_rows", "auto_batch_size", "matrix_bytes", "batch_bounds",
           "AUTO_FRACTION", "AUTO_BATCH_SHARE"]

#: Stream without a batch size when the matrix takes more than this fraction
#: of the device's free memory.
AUTO_FRACTION = 0.5
#: An automatic block takes at most this share of the free memory: room for
#: the two blocks in flight and each block's working copies in the fit (the
#: column-sorted copy of sparse rows, the (column, count) pairs, float64
#: temporaries).
AUTO_BATCH_SHARE = 1.0 / 16


def matrix_bytes(counts) -> int:
    """Bytes of a dense tensor (numel x element size) or of a SparseCounts'
    CSR parts (row offsets, column indices and values)."""
    if isinstance(counts, SparseCounts):
        return sum(t.numel() * t.element_size()
                   for t in (counts.crow_indices, counts.col_indices, counts.values))
    return counts.numel() * counts.element_size()


def auto_batch_size(nbytes: int, rows: int, free_bytes: int, *,
                    fraction: float = AUTO_FRACTION,
                    share: float = AUTO_BATCH_SHARE) -> Optional[int]:
    """The rule for streaming unasked: ``None`` (move the whole matrix to the
    device) when its ``nbytes`` are at most ``fraction`` of ``free_bytes``;
    else rows per block such that a block of average rows takes at most
    ``share`` of ``free_bytes`` (at least 1 row, at most ``rows``)."""
    if rows <= 0 or nbytes <= fraction * free_bytes:
        return None
    return int(max(1, min(rows, (share * free_bytes * rows) // nbytes)))


def batch_bounds(n_rows: int, batch_size: int) -> List[Tuple[int, int]]:
    """The blocks ``[(s, e), ...]`` of ``batch_size`` rows (the last one
    shorter); none for 0 rows."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return [(s, min(s + batch_size, n_rows)) for s in range(0, n_rows, batch_size)]


def _parts(block) -> Tuple[Tensor, ...]:
    if isinstance(block, SparseCounts):
        return (block.crow_indices, block.col_indices, block.values)
    return (block.reshape(-1),)


def _rebuild(template, parts: Tuple[Tensor, ...], n_rows: int):
    if isinstance(template, SparseCounts):
        return SparseCounts._of_parts(*parts, (n_rows, template.shape[1]),
                                      template.count_dtype)
    return parts[0].view(n_rows, template.shape[1])


class _Staging:
    """Two sets of staging buffers (one per part of a block), each sized to
    the largest block, and the copies between them and the device."""

    def __init__(self, counts, bounds, device: torch.device, pin: bool):
        self.device, self.pin = device, pin
        self.cuda = device.type == "cuda"
        n_sets = min(2, len(bounds))
        if isinstance(counts, SparseCounts):
            crow = counts.crow_indices
            s = torch.tensor([b[0] for b in bounds], dtype=torch.long)
            e = torch.tensor([b[1] for b in bounds], dtype=torch.long)
            nnz = int((crow[e] - crow[s]).max()) if len(bounds) else 0
            rows = max((b - a for a, b in bounds), default=0)
            sizes = [(rows + 1, crow.dtype), (nnz, counts.col_indices.dtype),
                     (nnz, counts.values.dtype)]
        else:
            rows = max((b - a for a, b in bounds), default=0)
            sizes = [(rows * counts.shape[1], counts.dtype)]
        self.buffers = [[torch.empty(n, dtype=dt, pin_memory=pin) for n, dt in sizes]
                        for _ in range(n_sets)]
        self.read = [None] * n_sets       # the event of the copy that last read each set
        self.stream = torch.cuda.Stream(device) if self.cuda else None

    def load(self, i: int, block):
        """Block i into set i % 2, then on its way to the device: (the
        device parts, the event after their copy or None)."""
        j = i % len(self.buffers)
        if self.read[j] is not None:
            self.read[j].synchronize()    # the copy out of this set has finished
        staged = []
        for buf, part in zip(self.buffers[j], _parts(block)):
            if self.cuda and part.is_pinned():
                # Already page-locked (a matrix kept in pinned memory): copied
                # to the device from where it is, not through the host twice.
                staged.append(part)
                continue
            view = buf[:part.numel()]
            view.copy_(part)
            staged.append(view)
        if not self.cuda:                 # (a testing aid: the staged path on the CPU)
            return tuple(v.clone() for v in staged), None
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            out = tuple(v.to(self.device, non_blocking=True) for v in staged)
            done = torch.cuda.Event()
            done.record(self.stream)
        self.read[j] = done
        return out, done


def stream_rows(counts, device, batch_size: int, *,
                staged: Optional[bool] = None) -> Iterator[Tuple[int, int, object]]:
    """Yield ``(start, stop, block)`` for the row blocks of ``batch_size``
    rows of ``counts`` (a dense ``(B, V)`` tensor or a SparseCounts), in
    order, each block on ``device`` (or a :class:`~dirmult_ext.data.counts.RowSource`,
    whose blocks are read and moved unstaged). ``staged`` (default: when ``device`` is
    CUDA and the counts are on the CPU) sends the blocks through pinned
    staging buffers on a copy stream, block i + 1 in flight while block i is
    worked on (Note [Row streaming]); ``staged=True`` on a CPU device runs
    that machinery without pinning or streams (for tests)."""
    device = torch.device(device)
    bounds = batch_bounds(counts.shape[0], batch_size)
    if staged is None:
        staged = device.type == "cuda" and counts.device.type == "cpu"
    if isinstance(counts, RowSource):  # blocks made as read: nothing to stage from
        staged = False
    if not staged:
        for s, e in bounds:
            yield s, e, counts[s:e].to(device, non_blocking=True)
        return
    if not bounds:
        return
    cuda = device.type == "cuda"
    stage = _Staging(counts, bounds, device, pin=cuda)
    compute = torch.cuda.current_stream(device) if cuda else None

    def load(i):
        s, e = bounds[i]
        return stage.load(i, counts[s:e])

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dirmult-rows")
    try:
        pending = pool.submit(load, 0)
        for i, (s, e) in enumerate(bounds):
            parts, done = pending.result()
            if cuda:
                compute.wait_event(done)
                for t in parts:
                    t.record_stream(compute)
            if i + 1 < len(bounds):
                pending = pool.submit(load, i + 1)
            yield s, e, _rebuild(counts, parts, e - s)
    finally:
        pool.shutdown(wait=True)
