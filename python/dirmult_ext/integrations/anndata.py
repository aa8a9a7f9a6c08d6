"""AnnData in, AnnData out: scanpy-style tools that fit the package's models
to the counts of an :class:`anndata.AnnData` and write the results where
scanpy users look for them.

* :func:`dm_mixture`: a Dirichlet-multinomial mixture (clustering), as
  :func:`dirmult_ext.fit_mixture`;
* :func:`dm_fit`: one Dirichlet-multinomial, as :func:`dirmult_ext.fit`;
* :func:`dm_regression`: DM regression on ``obs`` columns, as
  :func:`dirmult_ext.fit_regression`.

Conventions (those of ``scanpy.tl.leiden``): observations (cells) are the
rows and variables (genes) the categories; the counts come from ``adata.X``,
a named ``layer=``, or ``adata.raw.X`` with ``use_raw=True``; results go
under ``key_added``; ``copy=True`` returns a modified copy and leaves the
input alone, ``copy=False`` (default) writes into ``adata`` and returns
None. Every value written is one ``anndata`` can save to ``.h5ad``.

Counts are checked on a sample (about 1e5 stored values: evenly spaced
values of a sparse matrix, evenly spaced rows of a dense one, the first rows
of a backed one), never densified: log-normalized or scaled data raise a
ValueError that names the layer (or ``use_raw=True``) holding counts.

A backed AnnData (``anndata.read_h5ad(path, backed="r")``) is fitted from
the file in row blocks (:class:`BackedRows`, a
:class:`~dirmult_ext.data.counts.RowSource`): each pass of the fit reads the
matrix once, a block at a time, so a matrix larger than memory fits (the
results, of size n_obs x K and n_vars x K, are held in memory). Its ``X``
and ``raw.X`` stay on disk (CSR or dense); layers are in memory in backed
mode. ``copy=True`` is refused for a backed object (it would load the
matrix).

``anndata`` (and the ``pandas`` it brings) are imported only when a
function here is called.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..models.fit import fit as _fit_dm
from ..models.mixture import fit_mixture
from ..models.regression.data import INTERCEPT
from ..models.regression.fit import fit_regression
from ..data.counts import RowSource

__all__ = ["dm_mixture", "dm_fit", "dm_regression", "BackedRows"]

#: About this many stored values are read to tell counts from normalized data.
_SAMPLE_VALUES = 100_000


def _anndata():
    try:
        import anndata
    except ImportError:
        raise ImportError("dirmult_ext.integrations.anndata needs anndata: "
                          "pip install 'dirmult_ext[anndata]'") from None
    return anndata


# ---------------------------------------------------------------------------
# where the counts are
# ---------------------------------------------------------------------------
def _is_h5_dataset(m) -> bool:
    return type(m).__module__.startswith("h5py") and hasattr(m, "shape") and hasattr(m, "dtype")


def _is_backed_sparse(m) -> bool:
    # anndata's backed CSR/CSC datasets (their class moved between releases)
    return (type(m).__module__.startswith("anndata") and getattr(m, "format", None) in
            ("csr", "csc") and hasattr(m, "shape"))


def _is_backed(m) -> bool:
    return _is_h5_dataset(m) or _is_backed_sparse(m)


class BackedRows(RowSource):
    """The rows of an on-disk matrix of a backed AnnData (an ``h5py``
    dataset, or anndata's backed CSR dataset), read ``[start, stop)`` at a
    time: a dense block as a NumPy array, a sparse one as scipy CSR.

    Args:
        matrix: ``adata.X`` or ``adata.raw.X`` of ``read_h5ad(..., backed="r")``.
        where: how to name the matrix in errors.
    """

    def __init__(self, matrix, where: str = "adata.X"):
        if _is_backed_sparse(matrix) and matrix.format != "csr":
            raise ValueError(
                f"{where} is stored on disk as {matrix.format.upper()}: a block of rows would "
                "read the whole matrix. Rewrite the file with a CSR X (adata.X = "
                "scipy.sparse.csr_matrix(adata.X) before write_h5ad), or load it into memory "
                "(adata.to_memory())")
        if not _is_backed(matrix):
            raise TypeError(f"{where} must be a backed matrix (h5py dataset or anndata's "
                            f"backed CSR dataset), got {type(matrix).__name__}")
        self.matrix, self.where = matrix, where
        self.shape = tuple(int(s) for s in matrix.shape)
        self.sparse = _is_backed_sparse(matrix)
        group = getattr(matrix, "group", None) if self.sparse else None
        # The CSR parts are sliced directly: anndata's row indexing costs
        # about 15 ms a call in its checks, more than the read of a block.
        self._csr = (tuple(group[k] for k in ("data", "indices", "indptr"))
                     if group is not None
                     and all(k in group for k in ("data", "indices", "indptr")) else None)
        self._indptr = None

    def read(self, start: int, stop: int):
        if self._csr is None:
            return self.matrix[start:stop]
        import scipy.sparse
        data, indices, indptr = self._csr
        if self._indptr is None:          # B + 1 offsets, like the fit's row totals
            self._indptr = np.asarray(indptr[()], dtype=np.int64)
        j0, j1 = int(self._indptr[start]), int(self._indptr[stop])
        return scipy.sparse.csr_matrix(
            (data[j0:j1], indices[j0:j1],
             self._indptr[start:stop + 1] - j0), shape=(stop - start, self.shape[1]))

    def row_bytes(self) -> float:
        B, V = self.shape
        itemsize = np.dtype(self.matrix.dtype).itemsize
        if not self.sparse:
            return float(V * itemsize)
        group = getattr(self.matrix, "group", None)
        if group is None or "data" not in group:
            return float(V * itemsize)
        nnz = int(group["data"].shape[0])
        return nnz * (itemsize + np.dtype(group["indices"].dtype).itemsize) / max(B, 1)


def _matrix(adata, layer: Optional[str], use_raw: bool) -> Tuple[Any, str, Any]:
    """(the matrix, its name in errors, its var names) for the arguments."""
    if layer is not None and use_raw:
        raise ValueError("pass either layer= or use_raw=True, not both")
    if layer is not None:
        if layer not in adata.layers:
            raise ValueError(f"layer={layer!r}: adata has no such layer; its layers are "
                             f"{list(adata.layers.keys())}")
        return adata.layers[layer], f"adata.layers[{layer!r}]", adata.var_names
    if use_raw:
        if adata.raw is None:
            raise ValueError("use_raw=True but adata.raw is None")
        return adata.raw.X, "adata.raw.X", adata.raw.var_names
    if adata.X is None:
        raise ValueError(f"adata.X is None; pass layer= (layers: {list(adata.layers.keys())})")
    return adata.X, "adata.X", adata.var_names


def _sample(m) -> np.ndarray:
    """About :data:`_SAMPLE_VALUES` stored values of ``m``, without
    densifying it or reading a backed one whole."""
    B, V = (int(s) for s in m.shape)
    if _is_backed(m):                                       # the first rows
        per_row = V
        group = getattr(m, "group", None) if _is_backed_sparse(m) else None
        if group is not None and "data" in group:
            per_row = max(1, int(group["data"].shape[0]) // max(B, 1))
        m = m[0:min(B, max(1, _SAMPLE_VALUES // per_row))]
    if hasattr(m, "tocsr"):                                 # scipy sparse
        data = np.asarray(m.data)                           # the stored values
        if data.size > _SAMPLE_VALUES:
            data = data[np.linspace(0, data.size - 1, _SAMPLE_VALUES).astype(np.int64)]
        return data
    if hasattr(m, "compute"):                               # dask: a block of rows
        m = m[0:min(B, max(1, _SAMPLE_VALUES // max(V, 1)))].compute()
    a = np.asarray(m) if m.ndim == 2 else np.asarray(m).reshape(B, -1)
    if a.size > _SAMPLE_VALUES:
        rows = np.unique(np.linspace(0, B - 1, max(1, _SAMPLE_VALUES // max(V, 1)))
                         .astype(np.int64))
        a = a[rows]
    return a.ravel()


def _not_counts(m) -> Optional[Tuple[str, float]]:
    """(what is wrong, an offending value) for a sample that is not counts,
    else None."""
    v = _sample(m)
    if v.dtype.kind == "b" or v.size == 0:
        return None
    if v.dtype.kind in "iu":
        neg = v < 0
        return ("negative values", float(v[neg][0])) if neg.any() else None
    if v.dtype.kind != "f":
        return f"values of dtype {v.dtype}", float("nan")
    bad = ~np.isfinite(v)
    if bad.any():
        return "non-finite values", float(v[bad][0])
    neg = v < 0
    if neg.any():
        return "negative values (looks scaled or centered)", float(v[neg][0])
    frac = v != np.floor(v)
    if frac.any():
        return "non-integer values (looks log-normalized)", float(v[frac][0])
    return None


def _check_counts(adata, m, where: str) -> None:
    """A ValueError naming where counts are if the sample of ``m`` is not counts."""
    wrong = _not_counts(m)
    if wrong is None:
        return
    what, example = wrong
    layers = list(adata.layers.keys())
    found = [f"layer={k!r}" for k in layers
             if f"adata.layers[{k!r}]" != where and _not_counts(adata.layers[k]) is None]
    if adata.raw is not None and where != "adata.raw.X" and _not_counts(adata.raw.X) is None:
        found.append("use_raw=True")
    hint = (f"pass {' or '.join(found)}, which holds counts" if found else
            "none of its layers nor .raw holds counts: keep the raw counts in a layer "
            "(adata.layers['counts'] = adata.X.copy()) before normalizing")
    raise ValueError(f"{where} holds {what}, e.g. {example:g}; a Dirichlet-multinomial fit "
                     f"needs raw counts (non-negative integers). Its layers: {layers}, "
                     f".raw: {'present' if adata.raw is not None else 'absent'}; {hint}")


def _counts(adata, layer: Optional[str], use_raw: bool):
    """(counts as the fits take them, their var names, uns label of the source)."""
    m, where, var_names = _matrix(adata, layer, use_raw)
    if len(m.shape) != 2:
        raise ValueError(f"{where} must be a 2-d matrix, got shape {tuple(m.shape)}")
    _check_counts(adata, m, where)
    source = "raw/X" if use_raw else ("X" if layer is None else f"layers/{layer}")
    if _is_backed(m):
        return BackedRows(m, where), var_names, source
    if hasattr(m, "tocsr"):
        return m, var_names, source                        # scipy sparse: kept sparse
    if hasattr(m, "compute"):
        raise TypeError(f"{where} is a {type(m).__name__} (dask?): compute it first, or "
                        "write the AnnData to .h5ad and read it back with backed='r'")
    return np.asarray(m), var_names, source


def _start(adata, copy: bool):
    ad = _anndata()
    if not isinstance(adata, ad.AnnData):
        raise TypeError(f"adata must be an anndata.AnnData, got {type(adata).__name__}")
    if copy and adata.isbacked:
        raise ValueError("copy=True on a backed AnnData would load its matrix into memory; "
                         "pass copy=False (results go into the in-memory obs, obsm, varm "
                         "and uns) or load it first with adata.to_memory()")
    return adata


def _plain(v):
    """A value anndata can write in ``uns``, or None to leave it out."""
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, float, str, np.integer, np.floating)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
        return np.asarray(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return list(v)
    return str(v)


def _params(**kw) -> Dict[str, Any]:
    out = {}
    for k, v in kw.items():
        p = _plain(v)
        if p is not None:
            out[k] = p
    return out


def _put_var(adata, var_names, key: str, value, uns: dict, uns_key: str, *,
             column: bool = False) -> str:
    """``value`` (rows per fitted variable) into ``var[key]`` (``column``) or
    ``varm[key]`` when the fitted variables are ``adata``'s, else into
    ``uns[...][uns_key]`` with ``uns[...]["var_names"]`` (``use_raw`` with
    a different set of variables). Returns where it went."""
    if len(var_names) == adata.n_vars and bool((var_names == adata.var_names).all()):
        if column:
            adata.var[key] = value
            return f"var/{key}"
        adata.varm[key] = value
        return f"varm/{key}"
    uns[uns_key] = value
    uns["var_names"] = np.asarray(var_names, dtype=str)
    return f"uns/{uns_key}"


def _no_seed(fit_kwargs) -> None:
    if "seed" in fit_kwargs:
        raise TypeError("pass random_state= (scanpy's name) rather than seed=")


# ---------------------------------------------------------------------------
# the tools
# ---------------------------------------------------------------------------
def dm_mixture(adata, n_components: int, *, layer: Optional[str] = None,
               use_raw: bool = False, key_added: str = "dm_mixture",
               random_state: Optional[int] = 0, copy: bool = False, **fit_kwargs):
    """Cluster the observations with a Dirichlet-multinomial mixture
    (:func:`dirmult_ext.fit_mixture`), scanpy style.

    Args:
        adata: the AnnData (in memory or backed); counts per observation
            (cell) over the variables (genes).
        n_components: number of mixture components K.
        layer: take the counts from ``adata.layers[layer]`` instead of ``X``.
        use_raw: take them from ``adata.raw.X``.
        key_added: the name the results go under (below).
        random_state: seeds the initialization (``fit_mixture``'s ``seed``;
            None: random).
        copy: return a modified copy instead of writing into ``adata``.
        **fit_kwargs: passed to :func:`dirmult_ext.fit_mixture` (``n_init``,
            ``max_iter``, ``tol``, ``device``, ``batch_size``, ``prior``, ...).

    Writes (components ordered by decreasing weight, named ``"0"`` ..
    ``"K-1"``):

    * ``obs[key_added]``: categorical, the most probable component of each
      observation;
    * ``obsm[f"{key_added}_resp"]``: ``(n_obs, K)`` responsibilities
      (posterior component probabilities);
    * ``varm[f"{key_added}_alpha"]``: ``(n_vars, K)`` component
      concentrations (with ``use_raw`` and a ``.raw`` whose variables are
      not ``adata``'s: ``uns[key_added]["alpha"]`` with
      ``uns[key_added]["var_names"]``);
    * ``uns[key_added]``: ``params`` (the arguments, ``counts``: ``"X"``,
      ``"layers/NAME"`` or ``"raw/X"``), ``weights`` (K,), ``log_lik``,
      ``bic``, ``aic``, ``laplace`` (lower is better; see
      :class:`dirmult_ext.DMMixture`), ``log_prior``, ``converged``,
      ``n_iter``, ``restart_log_liks``, ``log_lik_trace``, and the keys the
      arrays went under.

    Returns:
        The modified copy with ``copy=True``, else None.
    """
    _start(adata, copy)
    _no_seed(fit_kwargs)
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) \
            or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r} "
                         "(to choose K, call once per K with its own key_added and compare "
                         "their uns[key]['bic'])")
    counts, var_names, source = _counts(adata, layer, use_raw)
    mix = fit_mixture(counts, n_components, seed=random_state, **fit_kwargs)
    import pandas as pd
    adata = adata.copy() if copy else adata
    R = mix.responsibilities.numpy()
    K = R.shape[1]
    names = [str(k) for k in range(K)]
    adata.obs[key_added] = pd.Categorical(np.asarray(names)[R.argmax(1)], categories=names)
    resp_key = f"{key_added}_resp"
    adata.obsm[resp_key] = R
    uns: Dict[str, Any] = {}
    alpha_at = _put_var(adata, var_names, f"{key_added}_alpha", mix.alpha.numpy().T, uns,
                        "alpha")
    uns.update(
        params=_params(n_components=int(n_components), counts=source, layer=layer,
                       use_raw=use_raw, random_state=random_state, **fit_kwargs),
        weights=mix.weights.numpy(), log_lik=float(mix.log_lik), bic=float(mix.bic),
        aic=float(mix.aic), laplace=float(mix.laplace), log_prior=float(mix.log_prior),
        converged=bool(mix.converged), n_iter=int(mix.n_iter),
        restart_log_liks=np.asarray(mix.restart_log_liks, dtype=np.float64),
        log_lik_trace=np.asarray(mix.log_lik_trace, dtype=np.float64),
        obs_key=key_added, obsm_key=f"obsm/{resp_key}", alpha_key=alpha_at)
    adata.uns[key_added] = uns
    return adata if copy else None


def dm_fit(adata, *, layer: Optional[str] = None, use_raw: bool = False,
           key_added: str = "dm_fit", copy: bool = False, **fit_kwargs):
    """Fit one Dirichlet-multinomial to all observations
    (:func:`dirmult_ext.fit`), scanpy style.

    Args:
        adata, layer, use_raw, key_added, copy: as :func:`dm_mixture`.
        **fit_kwargs: passed to :func:`dirmult_ext.fit` (``method``, ``tol``,
            ``max_iter``, ``weights``, ``device``, ``batch_size``, ...).

    Writes:

    * ``var[f"{key_added}_alpha"]``: the ``(n_vars,)`` concentrations (with
      ``use_raw`` and a ``.raw`` whose variables are not ``adata``'s:
      ``uns[key_added]["alpha"]`` with ``uns[key_added]["var_names"]``);
    * ``uns[key_added]``: ``params``, ``log_lik``, ``precision`` (sum of
      the concentrations), ``converged``, ``n_iter``, ``method``,
      ``grad_norm``, ``alpha_key``.

    Returns:
        The modified copy with ``copy=True``, else None.
    """
    _start(adata, copy)
    counts, var_names, source = _counts(adata, layer, use_raw)
    res = _fit_dm(counts, **fit_kwargs)
    adata = adata.copy() if copy else adata
    uns: Dict[str, Any] = {}
    alpha_at = _put_var(adata, var_names, f"{key_added}_alpha", res.alpha.numpy(), uns,
                        "alpha", column=True)
    uns.update(
        params=_params(counts=source, layer=layer, use_raw=use_raw,
                       **{k: v for k, v in fit_kwargs.items() if k != "weights"}),
        log_lik=float(res.log_lik), precision=float(res.precision),
        converged=bool(res.converged), n_iter=int(res.n_iter), method=res.method,
        grad_norm=float(res.grad_norm), alpha_key=alpha_at)
    adata.uns[key_added] = uns
    return adata if copy else None


def _design(obs, covariates: Sequence[str]):
    """The ``(n_obs, P)`` float64 design from ``obs`` columns: numeric and
    boolean columns as they are; categorical ones (pandas categoricals, and
    strings, whose categories are then their sorted values) one-hot without
    their first category, the reference. Returns (X, column names, the
    reference level per categorical column, the kind of each column)."""
    import pandas as pd
    if isinstance(covariates, str):
        covariates = [covariates]
    covariates = list(covariates)
    if not covariates:
        raise ValueError("covariates must name at least one obs column")
    missing = [c for c in covariates if c not in obs.columns]
    if missing:
        raise ValueError(f"covariates {missing} are not obs columns; obs has "
                         f"{list(obs.columns)}")
    if len(set(covariates)) != len(covariates):
        raise ValueError(f"covariates names a column twice: {covariates}")
    cols: List[np.ndarray] = []
    names: List[str] = []
    reference: Dict[str, str] = {}
    kinds: Dict[str, str] = {}
    for c in covariates:
        s = obs[c]
        if isinstance(s.dtype, pd.CategoricalDtype) or s.dtype == object or \
                pd.api.types.is_string_dtype(s.dtype):
            if s.isna().any():
                raise ValueError(f"obs column {c!r} has {int(s.isna().sum())} missing values")
            # unused categories would give all-zero columns (not identifiable)
            cat = (s if isinstance(s.dtype, pd.CategoricalDtype)
                   else s.astype("category")).cat.remove_unused_categories().cat
            levels = list(cat.categories)
            if len(levels) < 2:
                raise ValueError(f"obs column {c!r} has a single level {levels}: "
                                 "nothing to compare it with")
            reference[c] = str(levels[0])
            kinds[c] = "categorical"
            codes = cat.codes.to_numpy()
            for j, lev in enumerate(levels[1:], start=1):
                cols.append((codes == j).astype(np.float64))
                names.append(f"{c}[T.{lev}]")
        elif pd.api.types.is_bool_dtype(s.dtype) or pd.api.types.is_numeric_dtype(s.dtype):
            x = s.to_numpy(dtype=np.float64, na_value=np.nan)
            if not np.isfinite(x).all():
                raise ValueError(f"obs column {c!r} has {int((~np.isfinite(x)).sum())} "
                                 "missing or non-finite values")
            kinds[c] = "numeric"
            cols.append(x)
            names.append(str(c))
        else:
            raise TypeError(f"obs column {c!r} has dtype {s.dtype}: covariates must be "
                            "numeric, boolean, categorical or strings")
    return np.stack(cols, 1), names, reference, kinds


def dm_regression(adata, covariates: Sequence[str], *, layer: Optional[str] = None,
                  use_raw: bool = False, key_added: str = "dm_regression",
                  copy: bool = False, **fit_kwargs):
    """Dirichlet-multinomial regression of the counts on ``obs`` columns
    (:func:`dirmult_ext.fit_regression`): log alpha[b, v] = X[b] @ W[:, v] +
    bias[v].

    Args:
        adata, layer, use_raw, key_added, copy: as :func:`dm_mixture`.
        covariates: ``obs`` column names (no formula). Numeric and boolean
            columns enter as they are (booleans as 0/1). Categorical columns
            (pandas ``category``; string columns too, their categories then
            their sorted values) are one-hot encoded against a reference
            level, the first category (of those present): a column with
            levels ``a, b, c`` gives covariates ``col[T.b]`` and ``col[T.c]``,
            the effect of each level relative to ``a``. Reorder the
            categories (``obs[col].cat.reorder_categories``) to pick another
            reference.
        **fit_kwargs: passed to :func:`dirmult_ext.fit_regression`
            (``bias``, ``penalty``, ``lam``, ``tol``, ``max_iter``, ``se``,
            ``device``, ``batch_size``, ...).

    Writes, with one column per covariate (the names above) and, with a
    bias, a last column ``"(intercept)"``:

    * ``varm[f"{key_added}_coef"]``, ``varm[f"{key_added}_se"]``,
      ``varm[f"{key_added}_pval"]``: ``(n_vars, P [+ 1])`` DataFrames
      indexed by the variable names: coefficients (log-concentration
      scale), standard errors and two-sided Wald p-values (with ``use_raw``
      and a ``.raw`` whose variables are not ``adata``'s: under
      ``uns[key_added]`` as ``coef``, ``se``, ``pval`` with ``var_names``);
    * ``uns[key_added]``: ``params``, ``design`` (``columns``,
      ``reference_levels`` {column: level}, ``kinds`` {column: "numeric"
      or "categorical"}), ``log_lik``, ``null_log_lik`` (the intercept-only
      fit), ``objective``, ``converged``, ``n_iter``, ``grad_norm``,
      ``method``, ``se_method``, and the keys the tables went under.

    Returns:
        The modified copy with ``copy=True``, else None.
    """
    _start(adata, copy)
    X, names, reference, kinds = _design(adata.obs, covariates)
    counts, var_names, source = _counts(adata, layer, use_raw)
    res = fit_regression(counts, X, covariate_names=names,
                         category_names=[str(v) for v in var_names], **fit_kwargs)
    import pandas as pd
    adata = adata.copy() if copy else adata
    columns = list(names) + ([INTERCEPT] if res.has_bias else [])
    index = pd.Index(np.asarray(var_names, dtype=str))

    def table(w, b):
        parts = [w.numpy().T] + ([b.numpy()[:, None]] if res.has_bias else [])
        return pd.DataFrame(np.concatenate(parts, 1), index=index, columns=columns)

    uns: Dict[str, Any] = {}
    keys = {}
    for what, (w, b) in dict(coef=(res.W, res.bias), se=(res.se_W, res.se_bias),
                             pval=(res.p_W, res.p_bias)).items():
        keys[f"{what}_key"] = _put_var(adata, var_names, f"{key_added}_{what}", table(w, b),
                                       uns, what)
    uns.update(
        params=_params(covariates=list(covariates) if not isinstance(covariates, str)
                       else [covariates], counts=source, layer=layer, use_raw=use_raw,
                       **{k: v for k, v in fit_kwargs.items() if k != "weights"}),
        design=dict(columns=columns, reference_levels=reference, kinds=kinds),
        log_lik=float(res.log_lik), null_log_lik=float(res.null_log_lik),
        objective=float(res.objective), converged=bool(res.converged),
        n_iter=int(res.n_iter), grad_norm=float(res.grad_norm), method=str(res.method),
        se_method=str(res.se_method), **keys)
    adata.uns[key_added] = uns
    return adata if copy else None
