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


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("reading .h5ad files needs h5py: pip install h5py") from None
    return h5py


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _matrix_node(f, key: Optional[str]):
    name = key or "X"
    if name not in f:
        where = sorted(k for k in ("X", "raw/X") if k in f)
        layers = sorted(f["layers"].keys()) if "layers" in f else []
        raise ValueError(f"{f.filename}: no matrix {name!r}; it has {where} and layers "
                         f"{layers} (pass key='layers/NAME' or key='raw/X')")
    return f[name]


def _sparse_format(node) -> Optional[str]:
    attrs = node.attrs
    kind = _text(attrs.get("encoding-type", attrs.get("h5sparse_format", "")))
    return {"csr_matrix": "csr", "csc_matrix": "csc", "csr": "csr", "csc": "csc"}.get(kind)


def is_sparse(path, key: Optional[str] = None) -> bool:
    """Whether the file's matrix is stored sparse (a CSR or CSC group)."""
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        node = _matrix_node(f, key)
        return isinstance(node, h5py.Group) and _sparse_format(node) is not None


def read_matrix(path, key: Optional[str] = None):
    """The matrix ``key`` (default ``X``): scipy.sparse CSR if stored sparse,
    else a NumPy array."""
    h5py = _h5py()
    with h5py.File(path, "r") as f:
        node = _matrix_node(f, key)
        if isinstance(node, h5py.Dataset):
            return node[()]
        fmt = _sparse_format(node)
        if fmt is None:
            raise ValueError(f"{path}: {node.name} is a group but not a CSR or CSC matrix "
                             f"(attributes {dict(node.attrs)})")
        shape = tuple(int(s) for s in node.attrs.get("shape", node.attrs.get("h5sparse_shape")))
        data, indices, indptr = node["data"][()], node["indices"][()], node["indptr"][()]
    import scipy.sparse
    cls = scipy.sparse.csr_matrix if fmt == "csr" else scipy.sparse.csc_matrix
    return scipy.sparse.csr_matrix(cls((data, indices, indptr), shape=shape))


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
    with _h5py().File(path, "r") as f:
        return _names(f, "obs"), _names(f, "var")
