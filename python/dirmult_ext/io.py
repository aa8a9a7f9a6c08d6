"""Reading count matrices (rows = samples, columns = categories) and labels.

Formats, chosen by file name suffix:

* ``.npy``: a 2-D numeric array (no pickles).
* ``.npz``: a scipy.sparse matrix saved with ``scipy.sparse.save_npz``, or
  dense arrays saved with ``numpy.savez``: the one array in the file, or the
  one named ``key`` (default: ``counts`` if present).
* ``.csv``/``.tsv``/``.txt`` (optionally ``.gz``): numeric, comma- (csv),
  tab- (tsv) or whitespace- (txt) separated; a first line that is not
  numeric is taken as a header and skipped.
* ``.mtx`` (optionally ``.gz``): Matrix Market, read with ``scipy.io.mmread``.
* ``.h5ad``: AnnData, read with h5py (:mod:`dirmult_ext.h5ad`): ``X``, or the
  matrix named ``key`` (``raw/X``, ``layers/NAME``), rows = cells.

Sparse files (``.mtx``, scipy-sparse ``.npz``, ``.h5ad`` with a sparse
matrix) load as a
:class:`dirmult_ext.SparseCounts`, read without densifying; the others as a
dense ``(B, V)`` float32 torch tensor (float64 on request); ``sparse=`` asks
for either form from any file. The values are checked to be finite and
non-negative first.
"""
from __future__ import annotations

import gzip
import os
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["load_counts", "load_labels", "is_sparse_file"]

_EXACT_FLOAT32 = 2 ** 24


def _suffix(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
        return os.path.splitext(name)[1] + ".gz"
    return os.path.splitext(name)[1]


def _open_text(path: str):
    return gzip.open(path, "rt") if path.lower().endswith(".gz") else open(path, "r")


def _read_delimited(path: str, delimiter: Optional[str]) -> np.ndarray:
    with _open_text(path) as f:
        lines = [ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{path}: no data rows")

    def numeric(line: str) -> bool:
        try:
            [float(t) for t in (line.split(delimiter) if delimiter else line.split())]
            return True
        except ValueError:
            return False

    if not numeric(lines[0]):
        lines = lines[1:]                     # header
        if not lines:
            raise ValueError(f"{path}: only a header, no data rows")
    try:
        arr = np.loadtxt(lines, delimiter=delimiter, dtype=np.float64, ndmin=2)
    except ValueError as e:
        raise ValueError(f"{path}: not a numeric table ({e})") from None
    return arr


def _read_npz(path: str, key: Optional[str]) -> np.ndarray:
    with np.load(path, allow_pickle=False) as z:
        names = list(z.files)
        if "format" in names and "shape" in names and key is None:
            import scipy.sparse
            return scipy.sparse.load_npz(path).toarray()
        if key is None:
            if len(names) == 1:
                key = names[0]
            elif "counts" in names:
                key = "counts"
            else:
                raise ValueError(f"{path}: holds arrays {names}; name the counts with key=")
        if key not in names:
            raise ValueError(f"{path}: no array named {key!r} (has {names})")
        return z[key]


def _read_any(path: str, key: Optional[str]) -> np.ndarray:
    suf = _suffix(path)
    try:
        if suf == ".npy":
            return np.load(path, allow_pickle=False)
        if suf == ".npz":
            return _read_npz(path, key)
        if suf in (".csv", ".csv.gz"):
            return _read_delimited(path, ",")
        if suf in (".tsv", ".tsv.gz"):
            return _read_delimited(path, "\t")
        if suf in (".txt", ".txt.gz"):
            return _read_delimited(path, None)
        if suf in (".mtx", ".mtx.gz"):
            import scipy.io
            m = scipy.io.mmread(path)
            return m.toarray() if hasattr(m, "toarray") else np.asarray(m)
        if suf == ".h5ad":
            from .h5ad import read_matrix
            m = read_matrix(path, key)
            return m.toarray() if hasattr(m, "toarray") else np.asarray(m)
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from None
    except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith(path) else f"{path}: {msg}") from None
    raise ValueError(f"{path}: unknown format {suf or '(no suffix)'!r}; use .npy, .npz, "
                     ".csv, .tsv, .txt (optionally .gz), .mtx or .h5ad")


def is_sparse_file(path) -> bool:
    """Whether the file stores a sparse matrix: Matrix Market (``.mtx``,
    ``.mtx.gz``), a ``scipy.sparse.save_npz`` file or an ``.h5ad`` whose
    ``X`` is a CSR or CSC group."""
    path = os.fspath(path)
    suf = _suffix(path)
    if suf in (".mtx", ".mtx.gz"):
        return True
    if suf == ".h5ad" and os.path.exists(path):
        from .h5ad import is_sparse
        try:
            return is_sparse(path)
        except (OSError, ValueError):
            return False
    if suf == ".npz" and os.path.exists(path):
        try:
            with np.load(path, allow_pickle=False) as z:
                return "format" in z.files and "shape" in z.files
        except (OSError, ValueError):
            return False
    return False


def _read_sparse(path: str, key: Optional[str]):
    """The file as a scipy.sparse CSR matrix: sparse formats as stored, the
    others converted from their dense array."""
    import scipy.sparse
    suf = _suffix(path)
    try:
        if suf in (".mtx", ".mtx.gz"):
            import scipy.io
            m = scipy.io.mmread(path)
        elif suf == ".h5ad":
            from .h5ad import read_matrix
            m = read_matrix(path, key)
        elif suf == ".npz" and key is None:
            with np.load(path, allow_pickle=False) as z:
                stored_sparse = "format" in z.files and "shape" in z.files
            m = scipy.sparse.load_npz(path) if stored_sparse else _read_any(path, key)
        else:
            m = _read_any(path, key)
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot read ({e})") from None
    if not scipy.sparse.issparse(m):
        m = np.asarray(m)
        if m.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D (rows, categories) matrix, got "
                             f"{m.ndim}-D shape {m.shape}")
    return scipy.sparse.csr_matrix(m)


def _load_sparse(path: str, dtype: torch.dtype, key: Optional[str], require_integer: bool):
    from .sparse import SparseCounts
    m = _read_sparse(path, key)
    m.sum_duplicates()
    if m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"{path}: empty matrix of shape {m.shape}")
    if not (np.issubdtype(m.dtype, np.number) or m.dtype == np.bool_) or \
            np.iscomplexobj(m.data):
        raise ValueError(f"{path}: expected real numeric counts, got dtype {m.dtype}")
    data = m.data.astype(np.float64, copy=False)
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    for bad, what in ((~np.isfinite(data), "non-finite value"), (data < 0, "negative count"),
                      ((data != np.floor(data)) if require_integer else None,
                       "non-integer count")):
        if bad is not None and bad.any():
            j = int(np.argmax(bad))
            raise ValueError(f"{path}: {what} {data[j]} at row {rows[j]}, column "
                             f"{m.indices[j]} ({int(bad.sum())} in all)")
    if dtype == torch.float32 and data.size and data.max() > _EXACT_FLOAT32:
        raise ValueError(f"{path}: counts up to {data.max():.0f} exceed 2^24 and are not "
                         "exact in float32; pass dtype=torch.float64")
    m.data = data.astype(np.float32 if dtype == torch.float32 else np.float64)
    return SparseCounts.from_scipy(m)


def load_counts(path, *, dtype: torch.dtype = torch.float32, key: Optional[str] = None,
                require_integer: bool = False, sparse: Optional[bool] = None):
    """Read a count matrix.

    Args:
        path: file name; the format follows the suffix (module docstring).
        dtype: ``torch.float32`` (default) or ``torch.float64``.
        key: array name inside a multi-array ``.npz``; in an ``.h5ad``, the
            matrix (default ``X``; ``raw/X``, ``layers/NAME``).
        require_integer: also reject non-integer values.
        sparse: ``True``: a :class:`dirmult_ext.SparseCounts` (values of
            ``dtype``; dense formats are read dense and converted);
            ``False``: a dense tensor (sparse files densified); ``None``
            (default): sparse for sparse files (:func:`is_sparse_file`).

    Returns:
        ``(B, V)`` dense tensor of ``dtype``, or SparseCounts.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unreadable file, not 2-D, empty, non-numeric, negative or
            non-finite values (naming the first bad entry), or float32
            requested for counts above 2^24 (not exact in float32).
    """
    path = os.fspath(path)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if sparse is None:
        if _suffix(path) == ".h5ad":
            from .h5ad import is_sparse
            sparse = is_sparse(path, key)
        else:
            sparse = key is None and is_sparse_file(path)
    if sparse:
        return _load_sparse(path, dtype, key, require_integer)
    arr = np.asarray(_read_any(path, key))
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                   or arr.dtype == np.bool_):
        raise ValueError(f"{path}: expected numeric counts, got dtype {arr.dtype}")
    if np.iscomplexobj(arr):
        raise ValueError(f"{path}: complex values are not counts")
    if arr.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D (rows, categories) matrix, got "
                         f"{arr.ndim}-D shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{path}: empty matrix of shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    bad = ~np.isfinite(arr)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"{path}: non-finite value {arr[i, j]} at row {i}, column {j} "
                         f"({int(bad.sum())} in all)")
    neg = arr < 0
    if neg.any():
        i, j = np.argwhere(neg)[0]
        raise ValueError(f"{path}: negative count {arr[i, j]} at row {i}, column {j} "
                         f"({int(neg.sum())} in all)")
    if require_integer:
        frac = arr != np.floor(arr)
        if frac.any():
            i, j = np.argwhere(frac)[0]
            raise ValueError(f"{path}: non-integer count {arr[i, j]} at row {i}, column {j}")
    if dtype == torch.float32 and arr.max() > _EXACT_FLOAT32:
        raise ValueError(f"{path}: counts up to {arr.max():.0f} exceed 2^24 and are not "
                         "exact in float32; pass dtype=torch.float64")
    return torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)


def load_labels(path, n_rows: Optional[int] = None) -> Tuple[Tensor, np.ndarray]:
    """Read one label per row: ``.npy`` a 1-D array; any other file is text
    with one label per line (the first comma-separated field; no header, as
    labels may be strings; integer-valued labels become integers).
    Returns ``(codes (B,) int64, classes)`` with ``classes`` the sorted
    unique labels and ``classes[codes]`` the labels.

    Raises ValueError if there are not exactly ``n_rows`` labels (when given).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    suf = _suffix(path)
    if suf == ".npy":
        lab = np.load(path, allow_pickle=False)
    else:
        with _open_text(path) as f:
            lab = np.array([ln.strip().split(",")[0] for ln in f if ln.strip()])
        try:
            as_num = lab.astype(np.float64)
            if np.all(as_num == np.round(as_num)):
                lab = as_num.astype(np.int64)
        except ValueError:
            pass
    lab = np.asarray(lab)
    if lab.ndim != 1:
        lab = lab.squeeze()
    if lab.ndim != 1:
        raise ValueError(f"{path}: expected one label per row (1-D), got shape {lab.shape}")
    if n_rows is not None and lab.shape[0] != n_rows:
        raise ValueError(f"{path}: {lab.shape[0]} labels for {n_rows} rows")
    classes, codes = np.unique(lab, return_inverse=True)
    return torch.from_numpy(codes.astype(np.int64)), classes
