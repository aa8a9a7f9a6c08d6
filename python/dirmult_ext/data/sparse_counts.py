"""Sparse count matrices as input: :class:`SparseCounts` (the CSR parts of a
``(B, V)`` matrix), its conversion from torch sparse tensors and
``scipy.sparse`` matrices (each kept while its source is unchanged), and the
structure checks. See Note [CSR inputs].

The CSR ops (:mod:`dirmult_ext.ops.csr`) take the parts as plain dense
tensors, so TorchScript, ``torch.compile``, ``torch.export`` and ``opcheck``
see ordinary tensors; the public functions unpack sparse inputs into them
(:mod:`dirmult_ext.likelihood.sparse`).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..ops.csr import csc_parts, csc_parts_in_blocks, remember_csc, row_of_nonzero

__all__ = ["SparseCounts", "as_sparse_counts", "is_sparse_input", "csr_tensor", "value_rows",
           "offset_blocks"]

INDEX_DTYPES = (torch.int32, torch.int64)
# Components per call of the CUDA kernels (a grid dimension; the C++ checks it
# too, src/cuda/log_lik_csr_cuda.cu).
MAX_CUDA_COMPONENTS = 65535
#: Stored values per block of rows in the CPU computations that go over the
#: whole of a large matrix (:meth:`SparseCounts.row_blocks`).
ROW_BLOCK_NNZ = 1 << 20
_SPARSE_LAYOUTS = (torch.sparse_csr, torch.sparse_coo, torch.sparse_csc)
_COUNT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                 torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool)


def _is_scipy_sparse(x) -> bool:
    # Without importing scipy: only its own objects can be its matrices.
    return type(x).__module__.startswith("scipy.sparse") and hasattr(x, "tocsr")


def is_sparse_input(x) -> bool:
    """Whether ``x`` is a form of sparse counts: a :class:`SparseCounts`, a
    torch sparse CSR/CSC/COO tensor, or a ``scipy.sparse`` matrix or array."""
    if isinstance(x, SparseCounts):
        return True
    if isinstance(x, Tensor):
        return x.layout in _SPARSE_LAYOUTS
    return _is_scipy_sparse(x)


def value_rows(crow: Tensor, nnz: int, dtype: torch.dtype = torch.int64) -> Tensor:
    """The row (``dtype``, default int64) of each of ``nnz`` stored values,
    eagerly. On the CPU, where the offsets are well formed (start at 0, never
    decrease, end at ``nnz``: an O(B) check), each row's index repeated over
    its values (``repeat_interleave`` of the row lengths: no index per value
    beside the result), O(nnz) and faster than ``row_of_nonzero``'s binary
    search, which is taken otherwise (any offsets, CUDA) and which the ops'
    traced code uses."""
    B = crow.shape[0] - 1
    if crow.device.type == "cpu" and B > 0 and nnz > 0:
        d = crow.diff()
        if int(crow[0]) == 0 and int(crow[-1]) == nnz and bool((d >= 0).all()):
            return torch.repeat_interleave(d.to(dtype), output_size=nnz)
    return row_of_nonzero(crow, nnz).to(dtype)


def _kernel_values(values: Tensor) -> Tensor:
    """The values in a dtype the kernels read: float32/float64 as they are,
    float16/bfloat16 as float32, integers and bool as float64 (exact below
    2^53), each converted once."""
    if values.dtype in (torch.float32, torch.float64):
        return values
    if values.dtype in (torch.float16, torch.bfloat16):
        return values.float()
    return values.double()


class SparseCounts:
    """A ``(B, V)`` count matrix as CSR parts, prepared once for repeated use.

    Args:
        crow_indices: ``(B + 1,)`` row offsets, int32 or int64.
        col_indices: ``(nnz,)`` column indices of the stored values (the
            dtype of ``crow_indices``), sorted and distinct within a row.
        values: ``(nnz,)`` counts: float32/float64/float16/bfloat16 or
            integer (integers are held as float64, half types as float32,
            converted once; the compute dtype follows the original dtype as
            in the dense path: float64 counts compute in float64).
        shape: ``(B, V)``.
        validate: check the structure, which reads the indices (on CUDA a
            synchronization): row offsets starting at 0, non-decreasing and
            ending at nnz; column indices in ``[0, V)``, increasing within
            each row (no duplicates). Default (``None``): for CPU tensors
            only. Shapes, lengths, dtypes and devices are always checked.
            Unchecked bad indices never make the kernels read out of
            bounds: a row whose offsets or columns fall outside the matrix
            is NaN; unsorted or duplicate columns give a wrong result.

    The gradient with respect to the concentrations needs the matrix sorted
    by column: :meth:`csc` builds that copy the first time it is needed (the
    first call whose concentrations require grad) and keeps it (the same
    bytes again as the CSR parts: an index and a value per nonzero, plus
    ``V + 1`` column offsets). Values or indices edited in
    place afterwards are not seen by the kept copy: build a new object.
    """

    def __init__(self, crow_indices: Tensor, col_indices: Tensor, values: Tensor,
                 shape: Tuple[int, int], *, validate: Optional[bool] = None,
                 count_dtype: Optional[torch.dtype] = None):
        for name, t in (("crow_indices", crow_indices), ("col_indices", col_indices),
                        ("values", values)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 1:
                raise ValueError(f"{name} must be 1-d, got shape {tuple(t.shape)}")
        if len(shape) != 2:
            raise ValueError(f"shape must be (B, V), got {tuple(shape)}")
        B, V = int(shape[0]), int(shape[1])
        if B < 0 or V < 0:
            raise ValueError(f"shape must be (B, V) with B, V >= 0, got {(B, V)}")
        if crow_indices.dtype not in INDEX_DTYPES or col_indices.dtype not in INDEX_DTYPES:
            raise ValueError("crow_indices and col_indices must be int32 or int64, got "
                             f"{crow_indices.dtype} and {col_indices.dtype}")
        if values.dtype not in _COUNT_DTYPES:
            raise ValueError(f"values must have a count dtype (float or integer), got "
                             f"{values.dtype}")
        if crow_indices.numel() != B + 1:
            raise ValueError(f"crow_indices must have B + 1 = {B + 1} entries for shape "
                             f"{(B, V)}, got {crow_indices.numel()}")
        if col_indices.numel() != values.numel():
            raise ValueError(f"col_indices and values must have the same length, got "
                             f"{col_indices.numel()} and {values.numel()}")
        if not (crow_indices.device == col_indices.device == values.device):
            raise ValueError("crow_indices, col_indices and values must be on one device, got "
                             f"{crow_indices.device}, {col_indices.device}, {values.device}")
        if values.requires_grad:
            raise ValueError("sparse counts have no gradient: values must not require grad "
                             "(gradients are with respect to the concentrations)")
        if crow_indices.dtype != col_indices.dtype:
            crow_indices, col_indices = crow_indices.long(), col_indices.long()
        self.count_dtype = count_dtype if count_dtype is not None else values.dtype
        self.crow_indices = crow_indices.contiguous()
        self.col_indices = col_indices.contiguous()
        self.values = _kernel_values(values).contiguous()
        self.shape = (B, V)
        self._csc = None
        if validate is None:
            validate = self.device.type == "cpu"
        if validate:
            self.check_structure()

    # ------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nnz(self) -> int:
        return self.values.numel()

    @property
    def dtype(self) -> torch.dtype:
        """The counts' dtype as given (the values are held as
        ``self.values.dtype``)."""
        return self.count_dtype

    def __repr__(self) -> str:
        return (f"SparseCounts(shape={self.shape}, nnz={self.nnz}, dtype={self.count_dtype}, "
                f"device={self.device})")

    # ------------------------------------------------------------ conversions
    @classmethod
    def from_torch(cls, t: Tensor, *, validate: Optional[bool] = None) -> "SparseCounts":
        """From a 2-d torch sparse CSR, CSC or COO tensor (CSC and COO are
        converted once; COO's duplicates are summed)."""
        if t.layout not in _SPARSE_LAYOUTS:
            raise ValueError(f"expected a torch sparse CSR, CSC or COO tensor, got layout "
                             f"{t.layout}")
        if t.dim() != 2 or (t.layout != torch.sparse_coo and t.dense_dim() != 0):
            raise ValueError(f"sparse counts must be a 2-d (B, V) matrix without batch or "
                             f"dense dimensions, got shape {tuple(t.shape)}")
        if t.requires_grad:
            raise ValueError("sparse counts have no gradient: the counts must not require "
                             "grad (gradients are with respect to the concentrations)")
        count_dtype = t.dtype
        if t.layout == torch.sparse_coo:
            if t.sparse_dim() != 2:
                raise ValueError("sparse COO counts must have 2 sparse dimensions, got "
                                 f"{t.sparse_dim()}")
            t = t.coalesce().to_sparse_csr()
        elif t.layout == torch.sparse_csc:
            t = t.to_sparse_csr()
        return cls(t.crow_indices(), t.col_indices(), t.values(), tuple(t.shape),
                   validate=validate, count_dtype=count_dtype)

    @classmethod
    def from_scipy(cls, m, *, validate: Optional[bool] = None,
                   device=None) -> "SparseCounts":
        """From a ``scipy.sparse`` matrix or array of any format (converted to
        canonical CSR once: duplicates summed, columns sorted)."""
        import numpy as np
        if m.ndim != 2:
            raise ValueError(f"sparse counts must be 2-d (B, V), got shape {m.shape}")
        csr = m.tocsr()
        if not csr.has_canonical_format:
            csr = csr.copy()
            csr.sum_duplicates()  # (also sorts each row's columns)
        index = np.int64 if max(csr.indptr.dtype.itemsize, csr.indices.dtype.itemsize) > 4 \
            else np.int32
        crow = torch.from_numpy(np.ascontiguousarray(csr.indptr, dtype=index))
        col = torch.from_numpy(np.ascontiguousarray(csr.indices, dtype=index))
        values = torch.from_numpy(np.ascontiguousarray(csr.data))
        if device is not None:
            crow, col, values = crow.to(device), col.to(device), values.to(device)
        # Canonical by construction: the structure needs no check.
        return cls(crow, col, values, csr.shape, validate=bool(validate))

    @classmethod
    def from_dense(cls, counts: Tensor) -> "SparseCounts":
        """From a dense ``(B, V)`` tensor (its nonzeros)."""
        if counts.dim() != 2:
            raise ValueError(f"counts must be (B, V), got shape {tuple(counts.shape)}")
        return cls.from_torch(counts.detach().to_sparse_csr(), validate=False)

    @classmethod
    def _of_parts(cls, crow, col, values, shape, count_dtype) -> "SparseCounts":
        out = cls.__new__(cls)
        out.count_dtype = count_dtype
        out.crow_indices, out.col_indices, out.values = crow, col, values
        out.shape = tuple(shape)
        out._csc = None
        return out

    def to(self, device, non_blocking: bool = False) -> "SparseCounts":
        """The same matrix on ``device`` (the column-sorted copy too, if built)."""
        device = torch.device(device)
        if device == self.device:
            return self
        out = SparseCounts._of_parts(
            *(t.to(device, non_blocking=non_blocking)
              for t in (self.crow_indices, self.col_indices, self.values)),
            self.shape, self.count_dtype)
        if self._csc is not None:
            out._csc = tuple(t.to(device, non_blocking=non_blocking) for t in self._csc)
            remember_csc(out, out.crow_indices, out.col_indices, out.values, out._csc)
        return out

    def __getitem__(self, rows) -> "SparseCounts":
        """Rows ``s:e`` (a slice of step 1; the whole range is this object
        itself, with its column-sorted copy) or the rows of an integer index
        tensor, in its order, as SparseCounts."""
        if isinstance(rows, Tensor):
            return self._select(rows)
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TypeError("SparseCounts takes row slices s:e (step 1) or an index tensor")
        B = self.shape[0]
        s, e, _ = rows.indices(B)
        e = max(s, e)
        if s == 0 and e == B:
            return self
        j0, j1 = int(self.crow_indices[s]), int(self.crow_indices[e])
        crow = self.crow_indices[s:e + 1] - j0
        return SparseCounts._of_parts(crow, self.col_indices[j0:j1], self.values[j0:j1],
                                      (e - s, self.shape[1]), self.count_dtype)

    def _select(self, idx: Tensor) -> "SparseCounts":
        if idx.dim() != 1 or idx.is_floating_point():
            raise TypeError("SparseCounts row index must be a 1-d integer tensor")
        B = self.shape[0]
        idx = idx.to(self.device).long()
        if idx.numel() and (int(idx.min()) < -B or int(idx.max()) >= B):
            raise IndexError(f"row index out of range for {B} rows")
        idx = idx % max(B, 1)
        crow = self.crow_indices.long()
        starts = crow[idx]
        lengths = crow[idx + 1] - starts
        new_crow = torch.zeros(idx.numel() + 1, dtype=torch.int64, device=self.device)
        new_crow[1:] = lengths.cumsum(0)
        total = int(new_crow[-1])
        owner = torch.repeat_interleave(torch.arange(idx.numel(), device=self.device), lengths,
                                        output_size=total)
        pos = starts[owner] + torch.arange(total, device=self.device) - new_crow[:-1][owner]
        return SparseCounts._of_parts(new_crow.to(self.crow_indices.dtype), self.col_indices[pos],
                                      self.values[pos], (idx.numel(), self.shape[1]),
                                      self.count_dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def coo(self) -> Tuple[Tensor, Tensor, Tensor]:
        """(rows, columns) int64 and values float64 of the stored values, in
        row-major order."""
        return (value_rows(self.crow_indices, self.nnz), self.col_indices.long(),
                self.values.double())

    def transposed(self) -> Tensor:
        """The ``(V, B)`` transpose as a torch sparse CSR float64 tensor, from
        the column-sorted copy (:meth:`csc`)."""
        ptr, rows, values = self.csc()
        return csr_tensor(ptr, rows, values.double(), (self.shape[1], self.shape[0]))

    def proportions(self, N: Tensor) -> Tensor:
        """The rows' proportions n / N as a torch sparse CSR float64 tensor
        (rows with N = 0 stay empty); on the CPU a block of rows at a time
        (beside the result, a block's temporaries)."""
        inv = N.clamp_min(1e-300)
        x = torch.empty(self.nnz, dtype=torch.float64, device=self.device)
        for s, e in self.host_blocks():
            b = self[s:e]
            j0 = int(self.crow_indices[s])
            rows = value_rows(b.crow_indices, b.nnz, self.crow_indices.dtype)
            x[j0:j0 + b.nnz] = b.values.double() / inv[s:e].index_select(0, rows)
        return csr_tensor(self.crow_indices, self.col_indices, x, self.shape)

    def to_torch(self) -> Tensor:
        """A torch sparse CSR tensor sharing these parts."""
        return csr_tensor(self.crow_indices, self.col_indices, self.values, self.shape)

    def to_dense(self) -> Tensor:
        return self.to_torch().to_dense()

    # ------------------------------------------------------------ structure
    def check_structure(self) -> None:
        """Raise ``ValueError`` naming the part that breaks the CSR structure
        (reads the indices: on CUDA a synchronization)."""
        _check_structure(self.crow_indices, self.col_indices, self.shape)

    def csc(self) -> Tuple[Tensor, Tensor, Tensor]:
        """The column-sorted copy ``(csc_ptr (V + 1,), csc_rows (nnz,),
        csc_values (nnz,))`` the gradient reads, built once and kept (on the
        CPU a block of rows at a time: beside the copy, a block's temporaries)."""
        if self._csc is None:
            crow, col, values, V = (self.crow_indices, self.col_indices, self.values,
                                    self.shape[1])
            blocks = self.host_blocks()
            self._csc = (csc_parts_in_blocks(crow, col, values, V, blocks) if len(blocks) > 1
                         else csc_parts(crow, col, values, V,
                                        value_rows(crow, self.nnz, crow.dtype)))
            remember_csc(self, crow, col, values, self._csc)
        return self._csc

    def kept_csc(self) -> Optional[Tuple[Tensor, Tensor, Tensor]]:
        """:meth:`csc` if it has been built, else None."""
        return self._csc

    def row_totals(self) -> Tensor:
        """N_b, the rows' count totals, in float64 (on the CPU a block of
        rows at a time: the temporaries stay a fixed size). Each row's values
        are summed in their order, as a segment (no row index per value)."""
        out = torch.empty(self.shape[0], dtype=torch.float64, device=self.device)
        for s, e in self.host_blocks():
            b = self[s:e]
            out[s:e] = torch.segment_reduce(b.values.double(), "sum", offsets=b.crow_indices)
        return out

    def host_blocks(self):
        """The row ranges in which a computation over the whole matrix goes:
        :meth:`row_blocks` on the CPU, one range on another device (whose
        temporaries are not host memory) or for a matrix of one block."""
        if self.device.type != "cpu" or self.nnz <= ROW_BLOCK_NNZ:
            return [(0, self.shape[0])]
        return self.row_blocks()

    def row_blocks(self, nnz_per_block: int = 0):
        """Row ranges ``[(s, e), ...]`` covering the rows in order, each
        holding at most ``nnz_per_block`` (default ``ROW_BLOCK_NNZ``) stored
        values unless a single row holds more: the blocks in which the host
        computations go over a large matrix with bounded temporaries."""
        return offset_blocks(self.crow_indices, nnz_per_block or ROW_BLOCK_NNZ)


def offset_blocks(offsets: Tensor, per_block: int):
    """Ranges ``[(s, e), ...]`` covering the ``len(offsets) - 1`` segments
    of CSR-style ``offsets`` in order, each holding at most ``per_block``
    values unless a single segment holds more."""
    B = offsets.shape[0] - 1
    crow = offsets.cpu()
    bounds, s = [], 0
    while s < B:
        limit = int(crow[s]) + per_block
        e = int(torch.searchsorted(crow, torch.tensor(limit, dtype=crow.dtype),
                                   right=True)) - 1
        e = min(max(e, s + 1), B)
        bounds.append((s, e))
        s = e
    return bounds


def as_sparse_counts(x, *, validate: Optional[bool] = None) -> SparseCounts:
    """``x`` as :class:`SparseCounts`: itself, or converted once from a torch
    sparse tensor (the conversion is kept while the tensor lives and is not
    modified in place, and reused) or a ``scipy.sparse`` matrix (converted on
    every call: pass a SparseCounts to reuse it)."""
    if isinstance(x, SparseCounts):
        if validate:
            x.check_structure()
        return x
    if isinstance(x, Tensor) and x.layout in _SPARSE_LAYOUTS:
        return _converted(x, validate)
    if _is_scipy_sparse(x):
        return SparseCounts.from_scipy(x, validate=validate)
    raise TypeError("sparse counts must be a SparseCounts, a torch sparse CSR/CSC/COO "
                    f"tensor or a scipy.sparse matrix, got {type(x).__name__}")


# A torch sparse tensor's conversion, by id, kept while the tensor lives and
# is unchanged (its version counter, shared with its parts, is the same), so
# that calls on it again reuse the conversion and its column-sorted copy
# (SparseCounts.csc()): the cost of a training loop over one sparse tensor is
# then one conversion and one sort.
_CONVERTED: dict = {}


def _converted(x: Tensor, validate: Optional[bool]) -> SparseCounts:
    entry = _CONVERTED.get(id(x))
    if entry is not None:
        ref, version, sc = entry
        if ref() is x and x._version == version:
            if validate:
                sc.check_structure()
            return sc
    sc = SparseCounts.from_torch(x, validate=validate)
    if entry is None:
        weakref.finalize(x, _CONVERTED.pop, id(x), None)
    _CONVERTED[id(x)] = (weakref.ref(x), x._version, sc)
    return sc


def _check_structure(crow: Tensor, col: Tensor, shape) -> None:
    B, V = shape
    nnz = col.numel()
    if int(crow[0]) != 0:
        raise ValueError(f"crow_indices must start at 0, got {int(crow[0])}")
    if int(crow[-1]) != nnz:
        raise ValueError(f"crow_indices must end at the number of values ({nnz}), got "
                         f"{int(crow[-1])}")
    steps = crow[1:] - crow[:-1]
    if B > 0 and bool((steps < 0).any()):
        b = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"crow_indices must be non-decreasing: row {b} starts at "
                         f"{int(crow[b])} and ends at {int(crow[b + 1])}")
    if nnz == 0:
        return
    # The column checks go a block of values at a time on the CPU (See Note
    # [Host memory of a sparse fit]), a pass per rule, so that the first
    # error reported does not depend on the blocks.
    block = ROW_BLOCK_NNZ if col.device.type == "cpu" else nnz
    spans = [(s, min(nnz, s + block)) for s in range(0, nnz, block)]
    for s, e in spans:
        c = col[s:e]
        bad = (c < 0) | (c >= V)
        if bool(bad.any()):
            j = s + int(torch.nonzero(bad)[0])
            raise ValueError(f"col_indices must be in [0, V) = [0, {V}), got {int(col[j])} at "
                             f"position {j}")
    # Consecutive values of one row must have increasing columns: value j > 0
    # against value j - 1, unless j is a (nonempty) row's first value.
    starts = crow[:-1][steps > 0].long()
    for what in ("sorted", "distinct (no duplicates)"):
        for s, e in spans:
            lo = max(s, 1)
            if lo >= e:
                continue
            step = col[lo:e] - col[lo - 1:e - 1]
            bad = step < 0 if what == "sorted" else step == 0
            del step
            first = starts[int(torch.searchsorted(starts, lo)):int(torch.searchsorted(starts, e))]
            bad[first - lo] = False
            if bool(bad.any()):
                j = lo + int(torch.nonzero(bad)[0])
                b = int(torch.searchsorted(crow, torch.tensor(j, dtype=crow.dtype,
                                                              device=crow.device), right=True)) - 1
                raise ValueError(f"col_indices must be {what} within each row: row {b} has "
                                 f"column {int(col[j - 1])} then {int(col[j])}")


def csr_tensor(crow, col, values, shape) -> Tensor:
    with warnings.catch_warnings():  # (torch's "sparse CSR support is in beta")
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, values, tuple(shape), check_invariants=False)
