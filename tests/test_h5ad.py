"""AnnData .h5ad files (dirmult_ext.h5ad through io.load_counts), written
here with h5py in the layouts anndata uses, read without densifying."""
import numpy as np
import pytest
import torch

import dirmult_ext
from dirmult_ext import io
from dirmult_ext.data.h5ad import read_names

h5py = pytest.importorskip("h5py")
scipy_sparse = pytest.importorskip("scipy.sparse")


def random_matrix(B=40, V=25, density=0.1, seed=None):
    rng = np.random.default_rng(seed)
    m = scipy_sparse.random(B, V, density=density, format="csr", random_state=rng,
                            data_rvs=lambda n: 1 + rng.poisson(3, n)).astype(np.float32)
    m[0, 0] = 2.0  # never all zero
    return scipy_sparse.csr_matrix(m)


def write_names(f, group, names):
    g = f.create_group(group)
    g.attrs["encoding-type"] = "dataframe"
    g.attrs["_index"] = "_index"
    g.create_dataset("_index", data=np.array(names, dtype="S"))


def write_sparse(node_parent, name, m, fmt, old_style=False):
    m = m.tocsr() if fmt == "csr" else m.tocsc()
    g = node_parent.create_group(name)
    if old_style:
        g.attrs["h5sparse_format"] = fmt
        g.attrs["h5sparse_shape"] = np.array(m.shape)
    else:
        g.attrs["encoding-type"] = f"{fmt}_matrix"
        g.attrs["shape"] = np.array(m.shape)
    g.create_dataset("data", data=m.data)
    g.create_dataset("indices", data=m.indices)
    g.create_dataset("indptr", data=m.indptr)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("old_style", [False, True])
def test_sparse_x_loads_sparse_and_equal(tmp_path, fmt, old_style):
    m = random_matrix()
    path = tmp_path / "counts.h5ad"
    with h5py.File(path, "w") as f:
        write_sparse(f, "X", m, fmt, old_style)
        write_names(f, "obs", [f"cell{i}" for i in range(m.shape[0])])
        write_names(f, "var", [f"gene{j}" for j in range(m.shape[1])])
    assert io.is_sparse_file(path)
    sc = io.load_counts(path)
    assert isinstance(sc, dirmult_ext.SparseCounts)
    assert torch.equal(sc.to_dense(), torch.from_numpy(m.toarray()))
    obs, var = read_names(path)
    assert obs[3] == "cell3" and var[-1] == f"gene{m.shape[1] - 1}"
    dense = io.load_counts(path, sparse=False)
    assert torch.equal(dense, torch.from_numpy(m.toarray()))


def test_dense_x_and_layers(tmp_path):
    m = random_matrix(seed=1)
    raw = random_matrix(seed=2)
    path = tmp_path / "dense.h5ad"
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=m.toarray())
        layers = f.create_group("layers")
        write_sparse(layers, "counts", raw, "csr")
    assert not io.is_sparse_file(path)
    x = io.load_counts(path)
    assert isinstance(x, torch.Tensor) and torch.equal(x, torch.from_numpy(m.toarray()))
    layer = io.load_counts(path, key="layers/counts")
    assert isinstance(layer, dirmult_ext.SparseCounts)
    assert torch.equal(layer.to_dense(), torch.from_numpy(raw.toarray()))
    with pytest.raises(ValueError, match="no matrix 'layers/spliced'.*layers"):
        io.load_counts(path, key="layers/spliced")


def test_bad_values_are_named(tmp_path):
    m = random_matrix(seed=3)
    m.data[5] = -1.0
    path = tmp_path / "bad.h5ad"
    with h5py.File(path, "w") as f:
        write_sparse(f, "X", m, "csr")
    with pytest.raises(ValueError, match="negative count"):
        io.load_counts(path)


def test_fit_from_h5ad_equals_fit_from_the_matrix(tmp_path):
    m = random_matrix(B=200, V=12, density=0.5, seed=4)
    path = tmp_path / "fit.h5ad"
    with h5py.File(path, "w") as f:
        write_sparse(f, "X", m, "csc")
    from_file = dirmult_ext.fit(io.load_counts(path))
    dense = dirmult_ext.fit(torch.from_numpy(m.toarray()))
    assert torch.allclose(from_file.alpha, dense.alpha, rtol=1e-6)
