"""Reading count matrices (rows = samples, columns = categories) and labels.

Formats, chosen by file name suffix:

* ``.npy``: a 2-D numeric array (no pickles).
* ``.npz``: a scipy.sparse matrix saved with ``scipy.sparse.save_npz``, or
  dense arrays saved with ``numpy.savez``: the one array in the file, or the
  one named ``key`` (default: ``counts`` if present).
* ``.csv``/``.tsv``/``.txt`` (optionally ``.gz``): comma- (csv), tab- (tsv)
  or whitespace- (txt) separated; a ``.csv``/``.tsv`` whose first lines
  hold none of its separator but a semicolon, tab, comma or ``|`` the same
  number of times on each is read with that one. A UTF-8 byte-order mark is
  skipped. A first line that is not numeric is a
  header (column names), a first column that is not numeric holds row names
  (``index_col`` forces either way). Microbiome tables come as taxa x
  samples: a header whose first cell names the taxa (``Taxon``, ``OTU``,
  ``#OTU ID``, ``ASV``, ``feature``, ...) marks that layout and the table
  is transposed to samples x taxa (``samples_in_columns`` forces either
  way); with a blank first cell (R's ``write.csv``, pandas' ``to_csv``)
  the names decide (:mod:`dirmult_ext.data.orientation`).
  :func:`load_count_table` returns the names with the counts.
* ``.mtx`` (optionally ``.gz``): Matrix Market, read with ``scipy.io.mmread``.
* ``.h5ad``: AnnData, read with h5py (:mod:`dirmult_ext.h5ad`): ``X``, or the
  matrix named ``key`` (``raw/X``, ``layers/NAME``), rows = cells.

Sparse files (``.mtx``, scipy-sparse ``.npz``, ``.h5ad`` with a sparse
matrix) load as a
:class:`dirmult_ext.SparseCounts`, read without densifying; the others as a
dense ``(B, V)`` float32 torch tensor (float64 on request); ``sparse=`` asks
for either form from any file. The values are checked to be finite and
non-negative first. A file that cannot be read (corrupt, truncated, of
another format, a directory) raises :class:`CountFileError`, a
``ValueError`` naming the file and the problem.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import csv
import zipfile
from typing import List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .orientation import blank_corner_orientation

__all__ = ["load_counts", "load_count_table", "CountTable", "load_labels", "load_covariates",
           "is_sparse_file", "CountFileError"]

from .errors import CountFileError


_EXACT_FLOAT32 = 2 ** 24
#: Stored values per block of the loading checks.
CHECK_BLOCK = 1 << 20


def _suffix(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
        return os.path.splitext(name)[1] + ".gz"
    return os.path.splitext(name)[1]


def _open_text(path: str):
    # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of the
    # first cell.
    if path.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, "r", encoding="utf-8-sig")


_FORMATS = {".npy": "NumPy .npy", ".npz": "NumPy .npz", ".mtx": "Matrix Market",
            ".mtx.gz": "Matrix Market", ".h5ad": "AnnData .h5ad (HDF5)"}


@contextlib.contextmanager
def _reading(path: str):
    """Turn what the readers below raise on a corrupt, truncated or foreign
    file into a CountFileError naming the file and the problem."""
    suf = _suffix(path)
    fmt = _FORMATS.get(suf, "text table")
    try:
        yield
    except (CountFileError, FileNotFoundError, ImportError):
        raise
    except IsADirectoryError:
        raise CountFileError(f"{path}: is a directory, not a {fmt} file") from None
    except UnicodeDecodeError as e:
        raise CountFileError(f"{path}: not a text table (byte {e.start} is not UTF-8 text; "
                             "a binary file?)") from None
    except (OSError, EOFError, zipfile.BadZipFile, ValueError, KeyError, IndexError,
            TypeError) as e:
        msg = str(e)
        if msg.startswith(path):    # the readers' own messages
            raise CountFileError(msg) from None
        if isinstance(e, zipfile.BadZipFile):
            msg = f"{msg}: a truncated or corrupt archive"
        elif "pickle" in msg:
            # numpy's answer to bytes without its header; loading pickles
            # would run code from the file
            msg = "no NumPy header: not a .npy/.npz file, or a corrupt one"
        elif os.path.isdir(path):
            msg = "is a directory"
        raise CountFileError(f"{path}: cannot read as {fmt}: {msg or type(e).__name__}") \
            from None


# First header cells that name the rows of a taxa x samples table.
_TAXA_CORNERS = {"taxon", "taxa", "otu", "otuid", "otu_id", "otu id", "#otu id", "#otuid",
                 "asv", "asv_id", "feature", "featureid", "feature_id", "feature id",
                 "species", "genus", "family", "taxonomy", "clade", "clade_name", "gene",
                 "genes", "tax", "lineage"}


class _Table(NamedTuple):
    values: np.ndarray
    row_names: Optional[List[str]]
    col_names: Optional[List[str]]
    corner: Optional[str]
    lines: List[int]                # the file's line number of each data row
    first_col: int                  # the file's column (1-based) of the first value


def _is_number(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


def _read_delimited(path: str, delimiter: Optional[str],
                    index_col: Optional[bool] = None) -> _Table:
    with _open_text(path) as f:
        lines = []
        for i, ln in enumerate(f, 1):
            s = ln.strip()
            # "#OTU ID" heads QIIME's tables; other "#" lines are comments
            if s and (not s.startswith("#") or s.lower().replace(" ", "").startswith("#otuid")):
                lines.append((i, ln.rstrip("\r\n")))
    if not lines:
        raise ValueError(f"{path}: no data rows")
    if delimiter is not None:
        delimiter = _sniff_delimiter(path, delimiter, [ln for _, ln in lines[:20]])
    if delimiter is None:
        rows = [(i, ln.split()) for i, ln in lines]
    else:
        rows = [(i, r) for (i, _), r in zip(lines, csv.reader([ln for _, ln in lines],
                                                              delimiter=delimiter))]
    header = None
    if not all(_is_number(t) for t in rows[0][1]):
        header = [t.strip() for t in rows[0][1]]
        rows = rows[1:]
        if not rows:
            raise ValueError(f"{path}: only a header, no data rows")
    if index_col is None:
        index_col = any(not _is_number(r[0]) for _, r in rows if r)
    names = [r[0].strip() for _, r in rows] if index_col else None
    width = None
    data = []
    for i, r in rows:
        cells = r[1:] if index_col else r
        if width is None:
            width = len(cells)
        if len(cells) != width:
            raise ValueError(f"{path}: line {i} has {len(cells)} values, the first data "
                             f"line {width}")
        try:
            data.append([float(t) for t in cells])
        except ValueError:
            j = next(j for j, t in enumerate(cells) if not _is_number(t))
            col = j + 1 + (1 if index_col else 0)
            raise ValueError(f"{path}: not a numeric table: {cells[j]!r} at line {i}, "
                             f"column {col}") from None
    corner = None
    cols = None
    if header is not None:
        if index_col and len(header) == width + 1:
            corner, cols = header[0], header[1:]
        elif len(header) == width:
            cols = header
        else:
            raise ValueError(f"{path}: the header has {len(header)} names for {width} "
                             "columns of values")
    return _Table(np.asarray(data, dtype=np.float64).reshape(len(data), width or 0),
                  names, cols, corner, [i for i, _ in rows], 2 if index_col else 1)


_DELIMITERS = {",": "comma", "\t": "tab", ";": "semicolon", "|": "vertical bar"}


def _sniff_delimiter(path: str, expected: str, head: List[str]) -> str:
    """The suffix's separator if the first lines hold it; else the one of
    ``;``, tab, ``,``, ``|`` found the same number of times on each of them
    (a European spreadsheet's CSV is semicolon-separated); else, when the
    lines hold no separator at all, the suffix's (one column)."""
    if any(expected in ln for ln in head[:1]):
        return expected
    for d in (";", "\t", ",", "|"):
        n = [ln.count(d) for ln in head]
        if n[0] > 0 and len(set(n)) == 1:
            return d
    found = [_DELIMITERS[d] for d in _DELIMITERS if any(d in ln for ln in head)]
    if found:
        raise ValueError(f"{path}: expected {_DELIMITERS[expected]}-separated values; the "
                         f"first lines hold no {_DELIMITERS[expected]} but "
                         f"{' and '.join(found)}s in differing numbers")
    return expected


def _locator(table: Optional[_Table], transposed: bool):
    """``where(i, j)``: the position of entry (i, j) of the loaded matrix
    (rows = samples) in the file, 1-based as an editor or a spreadsheet shows
    it: a text file's line and column, else row i + 1, column j + 1 of the
    stored matrix (before any transposition)."""
    def where(i: int, j: int) -> str:
        r, c = (int(j), int(i)) if transposed else (int(i), int(j))
        if table is not None:
            return f"line {table.lines[r]}, column {c + table.first_col}"
        return f"row {r + 1}, column {c + 1}"
    return where


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


_TEXT = {".csv": ",", ".csv.gz": ",", ".tsv": "\t", ".tsv.gz": "\t", ".txt": None,
         ".txt.gz": None}


def _read_any(path: str, key: Optional[str]) -> np.ndarray:
    suf = _suffix(path)
    with _reading(path):
        if suf == ".npy":
            return np.load(path, allow_pickle=False)
        if suf == ".npz":
            return _read_npz(path, key)
        if suf in _TEXT:
            return _read_delimited(path, _TEXT[suf]).values
        if suf in (".mtx", ".mtx.gz"):
            import scipy.io
            m = scipy.io.mmread(path)
            return m.toarray() if hasattr(m, "toarray") else np.asarray(m)
        if suf == ".h5ad":
            from .h5ad import read_matrix
            m = read_matrix(path, key)
            return m.toarray() if hasattr(m, "toarray") else np.asarray(m)
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
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            return False
    return False


def _exact_in_float32(values: np.ndarray) -> bool:
    """Whether every value is a whole number in [0, 2^24], which float32
    holds exactly (checked a block at a time)."""
    if values.dtype.kind not in "iuf":
        return False
    for s in range(0, values.size, CHECK_BLOCK):
        b = values[s:s + CHECK_BLOCK]
        if not (b.min() >= 0 and b.max() <= _EXACT_FLOAT32
                and (values.dtype.kind != "f" or np.array_equal(b, np.floor(b)))):
            return False
    return True


def _read_sparse(path: str, key: Optional[str], dtype: torch.dtype = torch.float64):
    """The file as a scipy.sparse CSR matrix: sparse formats as stored, the
    others converted from their dense array."""
    import scipy.sparse
    suf = _suffix(path)
    with _reading(path):
        if suf in (".mtx", ".mtx.gz"):
            import scipy.io
            m = scipy.io.mmread(path)
            if (dtype == torch.float32 and scipy.sparse.issparse(m)
                    and m.data.dtype.itemsize > 4 and _exact_in_float32(m.data)):
                # The values as they will be kept, before the CSR conversion
                # (which then copies 4 bytes a value, not 8): exact, so every
                # check after sees the file's values.
                m.data = m.data.astype(np.float32)
        elif suf == ".h5ad":
            from .h5ad import read_matrix
            m = read_matrix(path, key)
        elif suf == ".npz" and key is None:
            with np.load(path, allow_pickle=False) as z:
                stored_sparse = "format" in z.files and "shape" in z.files
            m = scipy.sparse.load_npz(path) if stored_sparse else _read_any(path, key)
        else:
            m = _read_any(path, key)
    if not scipy.sparse.issparse(m):
        m = np.asarray(m)
        if m.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D (rows, categories) matrix, got "
                             f"{m.ndim}-D shape {m.shape}")
    return scipy.sparse.csr_matrix(m)


def _load_sparse(path: str, dtype: torch.dtype, require_integer: bool, m, where):
    from .sparse_counts import SparseCounts
    m.sum_duplicates()
    if m.shape[0] == 0 or m.shape[1] == 0:
        raise ValueError(f"{path}: empty matrix of shape {m.shape}")
    if not (np.issubdtype(m.dtype, np.number) or m.dtype == np.bool_) or \
            np.iscomplexobj(m.data):
        raise ValueError(f"{path}: expected real numeric counts, got dtype {m.dtype}")
    # The checks read the values in their stored dtype, a block at a time,
    # and find a bad value's row from the row offsets: beside the matrix,
    # temporaries of one block (Note [Host memory of a sparse fit]).
    data = m.data
    floating = np.issubdtype(data.dtype, np.floating)
    rules = [(np.isfinite, "non-finite value", floating),
             (lambda b: b >= 0, "negative count", data.dtype != np.bool_),
             (lambda b: b == np.floor(b), "non-integer count", floating and require_integer)]
    rules = [(ok_of, what) for ok_of, what, needed in rules if needed]
    first, n_bad, top = [-1] * len(rules), [0] * len(rules), None
    for s in range(0, data.size, CHECK_BLOCK):
        b = data[s:s + CHECK_BLOCK]
        for i, (ok_of, _) in enumerate(rules):
            ok = ok_of(b)
            n_ok = int(np.count_nonzero(ok))
            if n_ok < ok.size:
                if first[i] < 0:
                    first[i] = s + int(np.argmin(ok))
                n_bad[i] += ok.size - n_ok
        top = b.max() if top is None else max(top, b.max())
    for i, (_, what) in enumerate(rules):  # (the rules in order: the first one broken)
        if first[i] >= 0:
            j = first[i]
            row = int(np.searchsorted(m.indptr, j, side="right")) - 1
            raise ValueError(f"{path}: {what} {float(data[j])} at {where(row, m.indices[j])} "
                             f"({n_bad[i]} in all)")
    if dtype == torch.float32 and top is not None and float(top) > _EXACT_FLOAT32:
        raise ValueError(f"{path}: counts up to {float(top):.0f} exceed 2^24 and are "
                         "not exact in float32; pass dtype=torch.float64")
    # (no copy when the file stores the values in that dtype)
    m.data = data.astype(np.float32 if dtype == torch.float32 else np.float64, copy=False)
    del data
    return SparseCounts.from_scipy(m)


class CountTable(NamedTuple):
    """Counts with their names (:func:`load_count_table`)."""
    counts: object                  #: (B, V) tensor or SparseCounts, rows = samples
    sample_names: List[str]         #: B names (the file's, else "1", "2", ...)
    feature_names: List[str]        #: V names (the file's, else "1", "2", ...)
    transposed: bool                #: whether the file held samples in columns


def load_counts(path, *, dtype: torch.dtype = torch.float32, key: Optional[str] = None,
                require_integer: bool = False, sparse: Optional[bool] = None,
                samples_in_columns: Optional[bool] = None,
                index_col: Optional[bool] = None):
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
        samples_in_columns: the file holds one sample per column (taxa x
            samples) and is transposed; ``None`` (default): detected from a
            text file's header (module docstring), else False.
        index_col: a text file's first column holds row names; ``None``
            (default): when it is not numeric.

    Returns:
        ``(B, V)`` dense tensor of ``dtype``, or SparseCounts (rows = samples).

    Raises:
        FileNotFoundError: no such file.
        ValueError: unreadable file, not 2-D, empty, non-numeric, negative or
            non-finite values (naming the first bad entry), or float32
            requested for counts above 2^24 (not exact in float32).
    """
    return load_count_table(path, dtype=dtype, key=key, require_integer=require_integer,
                            sparse=sparse, samples_in_columns=samples_in_columns,
                            index_col=index_col).counts


def load_count_table(path, *, dtype: torch.dtype = torch.float32, key: Optional[str] = None,
                     require_integer: bool = False, sparse: Optional[bool] = None,
                     samples_in_columns: Optional[bool] = None,
                     index_col: Optional[bool] = None) -> CountTable:
    """:func:`load_counts` with the names: a :class:`CountTable` of the
    counts (rows = samples), the sample and feature names (from a text
    file's header and name column, else "1", "2", ...) and whether the file
    was transposed."""
    path = os.fspath(path)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    for name, v in (("samples_in_columns", samples_in_columns), ("index_col", index_col)):
        if v is not None and not isinstance(v, bool):
            raise ValueError(f"{name} must be True, False or None, got {v!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if sparse is None:
        if _suffix(path) == ".h5ad":
            from .h5ad import is_sparse
            with _reading(path):
                sparse = is_sparse(path, key)
        else:
            sparse = key is None and is_sparse_file(path)
    row_names = col_names = t = None
    suf = _suffix(path)
    if suf in _TEXT:
        with _reading(path):
            t = _read_delimited(path, _TEXT[suf], index_col)
        arr, row_names, col_names = t.values, t.row_names, t.col_names
        if samples_in_columns is None:
            corner = (t.corner or "").strip().strip('"').lower()
            samples_in_columns = corner in _TAXA_CORNERS
            if t.corner is not None and not corner:
                samples_in_columns = blank_corner_orientation(path, row_names, col_names)
        if arr.size == 0:
            raise ValueError(f"{path}: empty matrix of shape {arr.shape}")
        if sparse:
            import scipy.sparse
            arr = scipy.sparse.csr_matrix(arr)
    elif sparse:
        arr = _read_sparse(path, key, dtype)
    else:
        arr = np.asarray(_read_any(path, key))
    if suf == ".h5ad":
        from .h5ad import read_names
        with _reading(path):
            row_names, col_names = read_names(path)
    transposed = bool(samples_in_columns)
    if transposed:
        if arr.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D (rows, categories) matrix, got "
                             f"{arr.ndim}-D shape {arr.shape}")
        arr = arr.T
        row_names, col_names = col_names, row_names
    if sparse:
        import scipy.sparse
        counts = _load_sparse(path, dtype, require_integer, scipy.sparse.csr_matrix(arr),
                              _locator(t, transposed))
    else:
        counts = _checked_dense(arr, path, dtype, require_integer, _locator(t, transposed))
    B, V = counts.shape
    return CountTable(counts, list(row_names) if row_names else [str(i + 1) for i in range(B)],
                      list(col_names) if col_names else [str(i + 1) for i in range(V)],
                      transposed)


def _checked_dense(arr: np.ndarray, path: str, dtype: torch.dtype,
                   require_integer: bool, where) -> Tensor:
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
        raise ValueError(f"{path}: non-finite value {arr[i, j]} at {where(i, j)} "
                         f"({int(bad.sum())} in all)")
    neg = arr < 0
    if neg.any():
        i, j = np.argwhere(neg)[0]
        raise ValueError(f"{path}: negative count {arr[i, j]} at {where(i, j)} "
                         f"({int(neg.sum())} in all)")
    if require_integer:
        frac = arr != np.floor(arr)
        if frac.any():
            i, j = np.argwhere(frac)[0]
            raise ValueError(f"{path}: non-integer count {arr[i, j]} at {where(i, j)}")
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
    with _reading(path):
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


def load_covariates(path) -> Tuple[np.ndarray, Optional[List[str]], List[str]]:
    """Read a samples x covariates table: (values (B, P) float64, sample
    names or None, covariate names). Numeric values only."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    suf = _suffix(path)
    if suf == ".npy":
        with _reading(path):
            arr = np.load(path, allow_pickle=False)
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
            raise ValueError(f"{path}: expected a numeric (samples, covariates) matrix, got "
                             f"dtype {arr.dtype} shape {arr.shape}")
        return arr.astype(np.float64), None, [f"x{j + 1}" for j in range(arr.shape[1])]
    if suf not in _TEXT:
        raise ValueError(f"{path}: covariates must be .csv, .tsv, .txt (optionally .gz) or "
                         ".npy, got {suf or '(no suffix)'!r}")
    try:
        t = _read_delimited(path, _TEXT[suf])
    except (OSError, EOFError, UnicodeDecodeError) as e:
        with _reading(path):
            raise e
    except ValueError as e:
        msg = str(e)
        if "not a numeric table" in msg:
            msg += (" (covariates must be numeric: code a categorical covariate as 0/1 "
                    "indicator columns)")
        raise ValueError(f"covariates {msg}") from None
    if t.values.size == 0:
        raise ValueError(f"{path}: no covariates")
    P = t.values.shape[1]
    names = t.col_names or [f"x{j + 1}" for j in range(P)]
    return t.values, t.row_names, list(names)
