"""The AnnData tools (dirmult_ext.integrations.anndata) on real AnnData
objects built here from freshly drawn DM counts, checked against the
package's own fits of the same matrices and against hand-built designs."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from dirmult_ext import DirichletMultinomial, fit, fit_mixture, fit_regression
from dirmult_ext.models.metrics import adjusted_rand_index

from reference import separated_mixture


@pytest.fixture(scope="module")
def ad():
    return pytest.importorskip("anndata", reason="the AnnData tools need anndata")


@pytest.fixture(scope="module")
def sp():
    return pytest.importorskip("scipy.sparse", reason="sparse AnnData matrices need scipy")


@pytest.fixture(scope="module")
def tools(ad):
    from dirmult_ext.integrations import anndata as tools
    return tools


def draw(B=240):
    """(counts (B, 12) float32 numpy from a separated 3-component DM
    mixture, true labels)."""
    x, z, _ = separated_mixture(B=B)
    return x.numpy(), z.numpy()


def seed():
    return int(np.random.default_rng().integers(2 ** 31))


def assert_mixture_written(adata, mix, key="dm_mixture", alpha_in_varm=True):
    R = mix.responsibilities.numpy()
    K = R.shape[1]
    labels = adata.obs[key]
    assert str(labels.dtype) == "category"
    assert list(labels.cat.categories) == [str(k) for k in range(K)]
    np.testing.assert_array_equal(labels.astype(int).to_numpy(), R.argmax(1))
    np.testing.assert_allclose(adata.obsm[f"{key}_resp"], R, rtol=1e-9, atol=1e-12)
    uns = adata.uns[key]
    if alpha_in_varm:
        np.testing.assert_allclose(adata.varm[f"{key}_alpha"], mix.alpha.numpy().T, rtol=1e-9)
        assert uns["alpha_key"] == f"varm/{key}_alpha"
    np.testing.assert_allclose(uns["weights"], mix.weights.numpy(), rtol=1e-9)
    for name in ("log_lik", "bic", "aic", "laplace"):
        assert uns[name] == pytest.approx(getattr(mix, name), rel=1e-10), name
    assert uns["converged"] == mix.converged and uns["n_iter"] == mix.n_iter
    assert uns["params"]["n_components"] == K


@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_mixture_dense_and_sparse_x(ad, sp, tools, fmt, tmp_path):
    counts, z = draw()
    X = counts if fmt == "dense" else sp.csr_matrix(counts)
    adata = ad.AnnData(X=X)
    s = seed()
    assert tools.dm_mixture(adata, 3, n_init=1, random_state=s) is None
    mix = fit_mixture(X, 3, n_init=1, seed=s)
    assert_mixture_written(adata, mix)
    assert adata.uns["dm_mixture"]["params"]["counts"] == "X"
    assert adata.uns["dm_mixture"]["params"]["random_state"] == s
    # the clusters are the drawn ones (an independent check of the labels)
    assert adjusted_rand_index(adata.obs["dm_mixture"].to_numpy(), z) > 0.8
    # everything written can be saved and read back
    adata.write_h5ad(tmp_path / "out.h5ad")
    back = ad.read_h5ad(tmp_path / "out.h5ad")
    assert (back.obs["dm_mixture"] == adata.obs["dm_mixture"]).all()
    assert back.uns["dm_mixture"]["bic"] == adata.uns["dm_mixture"]["bic"]


def test_mixture_layer_and_raw(ad, sp, tools):
    """Counts in a layer and in .raw (with more variables than X, as after
    a selection of genes); X log-normalized."""
    counts, _ = draw()
    full = ad.AnnData(X=sp.csr_matrix(counts))
    full.var_names = [f"g{v}" for v in range(counts.shape[1])]
    lognorm = np.log1p(counts / counts.sum(1, keepdims=True) * 1e4).astype(np.float32)
    adata = ad.AnnData(X=lognorm[:, :10], var=full.var.iloc[:10].copy())
    adata.layers["counts"] = sp.csr_matrix(counts[:, :10])
    adata.raw = full
    s = seed()

    tools.dm_mixture(adata, 2, layer="counts", random_state=s, n_init=1, key_added="by_layer")
    assert_mixture_written(adata, fit_mixture(sp.csr_matrix(counts[:, :10]), 2, n_init=1,
                                              seed=s), key="by_layer")
    assert adata.uns["by_layer"]["params"]["counts"] == "layers/counts"

    tools.dm_mixture(adata, 2, use_raw=True, random_state=s, n_init=1, key_added="by_raw")
    mix = fit_mixture(sp.csr_matrix(counts), 2, n_init=1, seed=s)
    assert_mixture_written(adata, mix, key="by_raw", alpha_in_varm=False)
    uns = adata.uns["by_raw"]
    assert "by_raw_alpha" not in adata.varm       # .raw has 12 variables, X 10
    np.testing.assert_allclose(uns["alpha"], mix.alpha.numpy().T, rtol=1e-9)
    assert list(uns["var_names"]) == list(full.var_names)
    assert uns["params"]["counts"] == "raw/X"

    with pytest.raises(ValueError, match=r"adata.X holds non-integer values \(looks "
                       r"log-normalized\).*pass layer='counts' or use_raw=True"):
        tools.dm_mixture(adata, 2)
    with pytest.raises(ValueError, match=r"layer='nope'.*\['counts'\]"):
        tools.dm_mixture(adata, 2, layer="nope")
    with pytest.raises(ValueError, match="not both"):
        tools.dm_mixture(adata, 2, layer="counts", use_raw=True)
    with pytest.raises(ValueError, match="n_components must be a positive integer"):
        tools.dm_mixture(adata, [2, 3], layer="counts")
    with pytest.raises(ValueError, match="adata.raw is None"):
        tools.dm_mixture(ad.AnnData(X=counts), 2, use_raw=True)


def test_non_counts_errors(ad, sp, tools):
    counts, _ = draw(B=60)
    scaled = (counts - counts.mean(0)) / (counts.std(0) + 1)
    with pytest.raises(ValueError, match=r"adata.X holds negative values.*none of its layers "
                       r"nor .raw holds counts.*adata.layers\['counts'\]"):
        tools.dm_fit(ad.AnnData(X=scaled.astype(np.float32)))
    ints = counts.astype(np.int64)
    ints[5, 3] = -2
    with pytest.raises(ValueError, match="negative values, e.g. -2"):
        tools.dm_fit(ad.AnnData(X=ints))
    nan = counts.copy()
    nan[::3, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        tools.dm_fit(ad.AnnData(X=sp.csr_matrix(nan)))
    # A sparse X far too large to densify (4e10 entries) is checked on its
    # stored values: the error comes, not a MemoryError.
    rng = np.random.default_rng()
    B, V, nnz = 200_000, 200_000, 5000
    big = sp.csr_matrix((rng.uniform(0.1, 3.0, nnz).astype(np.float32),
                         (rng.integers(0, B, nnz), rng.integers(0, V, nnz))), shape=(B, V))
    with pytest.raises(ValueError, match="non-integer values"):
        tools.dm_mixture(ad.AnnData(X=big), 2)


def test_copy_semantics(ad, tools):
    counts, _ = draw(B=120)
    adata = ad.AnnData(X=counts.copy())
    s = seed()
    out = tools.dm_mixture(adata, 3, n_init=1, random_state=s, copy=True)
    assert isinstance(out, ad.AnnData) and out is not adata
    assert "dm_mixture" not in adata.obs and "dm_mixture" not in adata.uns
    assert len(adata.obsm) == 0 and len(adata.varm) == 0
    np.testing.assert_array_equal(adata.X, counts)
    assert_mixture_written(out, fit_mixture(counts, 3, n_init=1, seed=s))
    out2 = tools.dm_fit(adata, copy=True)
    assert "dm_fit_alpha" in out2.var and "dm_fit_alpha" not in adata.var
    assert tools.dm_fit(adata) is None and "dm_fit_alpha" in adata.var


def test_dm_fit(ad, sp, tools):
    counts, _ = draw(B=150)
    adata = ad.AnnData(X=sp.csr_matrix(counts))
    tools.dm_fit(adata, tol=1e-10)
    ref = fit(sp.csr_matrix(counts), tol=1e-10)
    np.testing.assert_allclose(adata.var["dm_fit_alpha"], ref.alpha.numpy(), rtol=1e-9)
    uns = adata.uns["dm_fit"]
    assert uns["log_lik"] == pytest.approx(ref.log_lik, rel=1e-12)
    assert uns["precision"] == pytest.approx(float(ref.alpha.sum()), rel=1e-12)
    assert uns["converged"] and uns["n_iter"] == ref.n_iter
    assert uns["params"]["tol"] == 1e-10 and uns["alpha_key"] == "var/dm_fit_alpha"


def regression_adata(ad, B=300):
    """Counts DM(N, exp(X W + b)) with X from a 3-level categorical (levels
    in the order ctrl, b, a: the reference is ctrl, not the alphabetically
    first), a numeric column and a string column; returns (adata, hand-built
    design, its column names)."""
    import pandas as pd
    rng = np.random.default_rng()
    V = 6
    cond = rng.choice(["ctrl", "b", "a"], B)
    batch = rng.choice(["s2", "s1"], B)
    x = rng.normal(size=B)
    design = np.stack([cond == "b", cond == "a", x, batch == "s2"], 1).astype(np.float64)
    W = rng.normal(0, 0.5, (4, V))
    bias = rng.normal(1.0, 0.3, V)
    N = torch.as_tensor(rng.integers(30, 120, B))
    counts = DirichletMultinomial(N, torch.as_tensor(np.exp(design @ W + bias))).sample()
    obs = pd.DataFrame({
        # an unused level too: it is dropped, not fitted as an all-zero column
        "cond": pd.Categorical(cond, categories=["ctrl", "b", "a", "unused"]),
        "x": x, "batch": batch}, index=[f"c{i}" for i in range(B)])
    adata = ad.AnnData(X=counts.numpy().astype(np.float32), obs=obs)
    return adata, design, ["cond[T.b]", "cond[T.a]", "x", "batch[T.s2]"]


def test_regression_categorical_covariates(ad, tools):
    adata, design, names = regression_adata(ad)
    tools.dm_regression(adata, ["cond", "x", "batch"])
    ref = fit_regression(adata.X, design)
    cols = names + ["(intercept)"]
    uns = adata.uns["dm_regression"]
    assert list(uns["design"]["columns"]) == cols
    assert dict(uns["design"]["reference_levels"]) == {"cond": "ctrl", "batch": "s1"}
    assert dict(uns["design"]["kinds"]) == {"cond": "categorical", "x": "numeric",
                                            "batch": "categorical"}
    for what, w, b in (("coef", ref.W, ref.bias), ("se", ref.se_W, ref.se_bias),
                       ("pval", ref.p_W, ref.p_bias)):
        df = adata.varm[f"dm_regression_{what}"]
        assert list(df.columns) == cols and list(df.index) == list(adata.var_names)
        expect = np.concatenate([w.numpy().T, b.numpy()[:, None]], 1)
        np.testing.assert_allclose(df.to_numpy(), expect, rtol=1e-7, atol=1e-10)
    assert uns["log_lik"] == pytest.approx(ref.log_lik, rel=1e-12)
    assert uns["null_log_lik"] == pytest.approx(ref.null_log_lik, rel=1e-12)
    assert uns["converged"] == ref.converged
    # bad covariates
    with pytest.raises(ValueError, match=r"\['nope'\] are not obs columns"):
        tools.dm_regression(adata, ["nope"])
    adata.obs["one"] = "same"
    with pytest.raises(ValueError, match="'one' has a single level"):
        tools.dm_regression(adata, ["one"])
    adata.obs["gap"] = adata.obs["x"].where(adata.obs["x"] > -1.5)
    with pytest.raises(ValueError, match="'gap' has .* missing"):
        tools.dm_regression(adata, ["gap"])


def test_backed_file_read_in_blocks(ad, sp, tools, tmp_path, monkeypatch):
    """A backed .h5ad (CSR and dense X) is fitted a block of rows at a
    time: every read of the matrix's datasets is recorded and none returns
    more than a block's worth, while the results equal the in-memory fit
    over the same blocks."""
    import h5py
    counts, _ = draw(B=240)
    block = 40
    for fmt in ("csr", "dense"):
        path = tmp_path / f"{fmt}.h5ad"
        X = sp.csr_matrix(counts) if fmt == "csr" else counts
        src = ad.AnnData(X=X)
        src.obs["cond"] = pd_categorical(np.where(np.arange(240) % 2 == 0, "u", "t"))
        src.write_h5ad(path)
        backed = ad.read_h5ad(path, backed="r")
        assert backed.isbacked
        reads = []
        get = h5py.Dataset.__getitem__

        def spy(self, sel, get=get):
            out = get(self, sel)
            reads.append((self.name, int(np.size(out))))
            return out

        # the counts check reads a sample of the first rows: here below a block
        monkeypatch.setattr(tools, "_SAMPLE_VALUES", 200)
        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
        s = seed()
        tools.dm_mixture(backed, 3, n_init=1, n_screen=4, random_state=s, batch_size=block)
        monkeypatch.setattr(h5py.Dataset, "__getitem__", get)
        mix = fit_mixture(X, 3, n_init=1, n_screen=4, seed=s, batch_size=block)
        assert_mixture_written(backed, mix)
        matrix = ["/X/data", "/X/indices"] if fmt == "csr" else ["/X"]
        sizes = [n for name, n in reads if name in matrix]
        largest = (np.diff(X.indptr[::block]).max() if fmt == "csr"
                   else block * counts.shape[1])
        assert sizes and max(sizes) <= largest
        # every pass reads every value: several passes, each in blocks
        whole = X.nnz if fmt == "csr" else counts.size
        assert sum(sizes) >= 3 * len(matrix) * whole
        with pytest.raises(ValueError, match="copy=True on a backed AnnData"):
            tools.dm_mixture(backed, 3, copy=True)
    # the regression reads the backed rows too (the dense file)
    tools.dm_regression(backed, ["cond"], batch_size=block)
    ref = fit_regression(counts, (np.arange(240) % 2 == 0).astype(np.float64),
                         batch_size=block)
    np.testing.assert_allclose(backed.varm["dm_regression_coef"].to_numpy()[:, 0],
                               ref.W.numpy()[0], rtol=1e-7, atol=1e-10)
    assert list(backed.uns["dm_regression"]["design"]["columns"])[0] == "cond[T.u]"


def pd_categorical(values):
    import pandas as pd
    return pd.Categorical(values, categories=["t", "u"])


def test_package_imports_without_anndata():
    """With anndata unavailable the package and this module import; the
    tools then say what to install."""
    code = ("import sys; sys.modules['anndata'] = None\n"
            "import dirmult_ext, dirmult_ext.integrations.anndata as t\n"
            "try:\n    t.dm_fit(object())\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert "pip install 'dirmult_ext[anndata]'" in out.stdout
