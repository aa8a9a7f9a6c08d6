"""AnnData ``.h5ad`` files read with h5py (an optional dependency), without
the ``anndata`` package: the count matrix (``X``, ``raw/X`` or a layer) as
stored, a scipy.sparse CSR matrix for sparse ones (CSR or CSC groups), a
NumPy array for dense ones, and the row (``obs``) and column (``var``)
names.

Layouts understood: the ``encoding-type`` attributes of anndata 0.7 and later
(``csr_matrix``, ``csc_matrix`` groups with ``data``, ``indices``,
``indptr`` and a ``shape`` attribute; ``dataframe`` groups whose ``_index``
attribute names the index dataset) and the ``h5sparse_format`` /
``h5sparse_shape`` attributes of earlier releases.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .errors import CountFileError


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("reading .h5ad files needs h5py: pip install h5py") from None
    return h5py


def _open(path):
    """The file opened read-only; a directory or a file that is not HDF5 is
    a CountFileError naming it."""
    import os
    h5py = _h5py()
    if os.path.isdir(path):
        raise CountFileError(f"{path}: is a directory, not an .h5ad file")
    if os.path.exists(path) and not h5py.is_hdf5(path):
        raise CountFileError(f"{path}: not an HDF5 file (no HDF5 signature), so not an "
                             ".h5ad file; a corrupt or truncated copy?")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise CountFileError(f"{path}: cannot open as HDF5 ({e})") from None


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _matrix_node(f, key: Optional[str]):
    name = key or "X"
    if name not in f:
        where = sorted(k for k in ("X", "raw/X") if k in f)
        layers = sorted(f["layers"].keys()) if "layers" in f else []
        raise CountFileError(f"{f.filename}: no matrix {name!r}; it has {where} and layers "
                         f"{layers} (pass key='layers/NAME' or key='raw/X')")
    return f[name]


def _sparse_format(node) -> Optional[str]:
    attrs = node.attrs
    kind = _text(attrs.get("encoding-type", attrs.get("h5sparse_format", "")))
    return {"csr_matrix": "csr", "csc_matrix": "csc", "csr": "csr", "csc": "csc"}.get(kind)


def is_sparse(path, key: Optional[str] = None) -> bool:
    """Whether the file's matrix is stored sparse (a CSR or CSC group)."""
    h5py = _h5py()
    with _open(path) as f:
        node = _matrix_node(f, key)
        return isinstance(node, h5py.Group) and _sparse_format(node) is not None


def read_matrix(path, key: Optional[str] = None):
    """The matrix ``key`` (default ``X``): scipy.sparse CSR if stored sparse,
    else a NumPy array."""
    h5py = _h5py()
    with _open(path) as f:
        node = _matrix_node(f, key)
        if isinstance(node, h5py.Dataset):
            return node[()]
        fmt = _sparse_format(node)
        if fmt is None:
            raise CountFileError(f"{path}: {node.name} is a group but not a CSR or CSC matrix "
                             f"(attributes {dict(node.attrs)})")
        shape = node.attrs.get("shape", node.attrs.get("h5sparse_shape"))
        parts = [p for p in ("data", "indices", "indptr") if p not in node]
        if shape is None or len(shape) != 2 or parts:
            raise CountFileError(f"{path}: {node.name} is a {fmt.upper()} group without "
                                 + (", ".join(parts) if parts else "a 2-D shape attribute"))
        shape = tuple(int(s) for s in shape)
        data, indices, indptr = node["data"][()], node["indices"][()], node["indptr"][()]
        name = node.name
    _check_compressed(path, name, fmt, shape, data, indices, indptr)
    import scipy.sparse
    cls = scipy.sparse.csr_matrix if fmt == "csr" else scipy.sparse.csc_matrix
    return scipy.sparse.csr_matrix(cls((data, indices, indptr), shape=shape))


def _check_compressed(path, name, fmt, shape, data, indices, indptr) -> None:
    """The CSR/CSC arrays describe a matrix of ``shape`` (scipy's own
    messages do not name the file)."""
    n_ptr = (shape[0] if fmt == "csr" else shape[1]) + 1
    what = f"{path}: {name} ({fmt.upper()}, shape {shape})"
    if indptr.ndim != 1 or indptr.shape[0] != n_ptr:
        raise CountFileError(f"{what}: indptr has {indptr.size} entries, expected {n_ptr}; "
                             "the file is corrupt or truncated")
    if data.ndim != 1 or indices.shape != data.shape:
        raise CountFileError(f"{what}: {indices.size} indices for {data.size} values")
    if not np.issubdtype(indptr.dtype, np.integer) or \
            not np.issubdtype(indices.dtype, np.integer):
        raise CountFileError(f"{what}: indptr and indices must be integers, got "
                             f"{indptr.dtype} and {indices.dtype}")
    if indptr[0] != 0 or indptr[-1] != data.size or bool((np.diff(indptr) < 0).any()):
        raise CountFileError(f"{what}: indptr must rise from 0 to the {data.size} values")
    n_idx = shape[1] if fmt == "csr" else shape[0]
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= n_idx):
        raise CountFileError(f"{what}: an index outside 0..{n_idx - 1}")


def _names(f, group: str) -> Optional[List[str]]:
    if group not in f:
        return None
    node = f[group]
    if isinstance(node, _h5py().Dataset):  # before anndata 0.7: a compound table
        fields = node.dtype.names or ()
        field = "index" if "index" in fields else (fields[0] if fields else None)
        return None if field is None else [_text(x) for x in node[field]]
    index = _text(node.attrs.get("_index", "_index"))
    if index not in node:
        return None
    return [_text(x) for x in node[index][()]]


def read_names(path) -> Tuple[Optional[List[str]], Optional[List[str]]]:
    """The row (``obs``) and column (``var``) names, None where absent."""
    with _open(path) as f:
        return _names(f, "obs"), _names(f, "var")
