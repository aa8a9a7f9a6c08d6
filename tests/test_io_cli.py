"""Count-matrix readers, the bundled digits data, and ``dirmult-ext fit``."""
import gzip
import math
import re

import numpy as np
import pytest
import scipy.io
import scipy.sparse
import torch

from dirmult_ext import cli
from dirmult_ext.cli import fit as fit_cli
from dirmult_ext.models import baselines
from dirmult_ext.data.datasets import load_digits
from dirmult_ext.likelihood.distribution import DirichletMultinomial
from dirmult_ext import fit
from dirmult_ext.data.io import load_counts, load_labels


def random_counts(B=30, V=6):
    x = np.random.default_rng().poisson(3.0, size=(B, V)).astype(np.float64)
    x[np.random.default_rng().random((B, V)) < 0.3] = 0
    return x


def write_all_formats(d, x):
    """Write x in every supported format; returns {name: path}."""
    paths = {}
    paths["npy"] = d / "x.npy"
    np.save(paths["npy"], x.astype(np.int32))
    paths["npz_dense"] = d / "dense.npz"
    np.savez(paths["npz_dense"], x)
    paths["npz_named"] = d / "named.npz"
    np.savez(paths["npz_named"], counts=x, other=np.zeros(3))
    paths["npz_sparse"] = d / "sparse.npz"
    scipy.sparse.save_npz(paths["npz_sparse"], scipy.sparse.csr_matrix(x))
    paths["csv"] = d / "x.csv"
    np.savetxt(paths["csv"], x, delimiter=",", fmt="%d")
    paths["csv_header"] = d / "h.csv"
    np.savetxt(paths["csv_header"], x, delimiter=",", fmt="%d",
               header=",".join(f"gene{i}" for i in range(x.shape[1])), comments="")
    paths["csv_gz"] = d / "x.csv.gz"
    with gzip.open(paths["csv_gz"], "wt") as f:
        np.savetxt(f, x, delimiter=",", fmt="%g")
    paths["tsv"] = d / "x.tsv"
    np.savetxt(paths["tsv"], x, delimiter="\t", fmt="%d")
    paths["txt"] = d / "x.txt"
    np.savetxt(paths["txt"], x, fmt="%d")
    paths["mtx"] = d / "x.mtx"
    scipy.io.mmwrite(str(paths["mtx"]), scipy.sparse.coo_matrix(x))
    paths["mtx_dense"] = d / "dense.mtx"
    scipy.io.mmwrite(str(paths["mtx_dense"]), x)
    return paths


def test_load_counts_all_formats(tmp_path):
    x = random_counts()
    for name, p in write_all_formats(tmp_path, x).items():
        t = load_counts(p, sparse=False)
        assert t.dtype == torch.float32 and t.shape == x.shape, name
        np.testing.assert_array_equal(t.numpy(), x, err_msg=name)
    assert load_counts(tmp_path / "x.npy", dtype=torch.float64).dtype == torch.float64
    np.savez(tmp_path / "two.npz", a=x, b=2 * x)
    np.testing.assert_array_equal(load_counts(tmp_path / "two.npz", key="b").numpy(), 2 * x)


def test_load_counts_errors(tmp_path):
    x = random_counts()

    def expect(arr_or_text, suffix, match, **kw):
        p = tmp_path / f"bad{expect.n}{suffix}"
        expect.n += 1
        if isinstance(arr_or_text, str):
            p.write_text(arr_or_text)
        else:
            np.save(p, arr_or_text)
        with pytest.raises(ValueError, match=match):
            load_counts(p, **kw)
    expect.n = 0

    neg = x.copy()
    neg[2, 3] = -1
    expect(neg, ".npy", "negative count -1.0 at row 3, column 4")
    nan = x.copy()
    nan[1, 0] = np.nan
    expect(nan, ".npy", "non-finite value nan at row 2, column 1")
    expect(x[0], ".npy", "2-D")
    expect(np.zeros((2, 3, 4)), ".npy", "2-D")
    expect(np.zeros((0, 4)), ".npy", "empty")
    expect(np.array([["a", "b"]]), ".npy", "numeric")
    expect(x + 0.5, ".npy", "non-integer", require_integer=True)
    expect(np.full((2, 2), 2.0 ** 25), ".npy", "2\\^24")
    expect("1,2,3\n4,x,6\n", ".csv", "not a numeric table")
    expect("a,b,c\n", ".csv", "only a header")
    expect("1,2\n3,4\n", ".xlsx", "unknown format")
    expect("not a zip", ".npz", "cannot read|bad|zip|pickle")
    np.savez(tmp_path / "two.npz", a=x, b=x)
    with pytest.raises(ValueError, match="key="):
        load_counts(tmp_path / "two.npz")
    with pytest.raises(ValueError, match="no array named"):
        load_counts(tmp_path / "two.npz", key="c")
    with pytest.raises(FileNotFoundError):
        load_counts(tmp_path / "missing.npy")
    # the float32 limit does not apply to float64
    np.save(tmp_path / "big.npy", np.full((2, 2), 2.0 ** 25))
    assert load_counts(tmp_path / "big.npy", dtype=torch.float64)[0, 0] == 2.0 ** 25


def test_load_labels(tmp_path):
    (tmp_path / "l.txt").write_text("cat\ndog\ncat\n")
    codes, classes = load_labels(tmp_path / "l.txt")
    assert codes.tolist() == [0, 1, 0] and list(classes) == ["cat", "dog"]
    np.save(tmp_path / "l.npy", np.array([3, 1, 3, 2]))
    codes, classes = load_labels(tmp_path / "l.npy", n_rows=4)
    assert list(classes[codes.numpy()]) == [3, 1, 3, 2]
    with pytest.raises(ValueError, match="3 labels for 5 rows"):
        load_labels(tmp_path / "l.txt", n_rows=5)


def test_digits_dataset():
    counts, labels = load_digits()
    assert counts.shape == (1797, 64) and counts.dtype == torch.float32
    assert labels.shape == (1797,) and labels.dtype == torch.int64
    assert float(counts.min()) == 0 and float(counts.max()) == 16
    assert bool((counts == counts.round()).all())
    per_class = torch.bincount(labels, minlength=10)
    assert per_class.sum() == 1797 and per_class.min() >= 170 and per_class.max() <= 190
    # the first image is a 0: a ring, empty in the centre column
    img = counts[0].view(8, 8)
    assert labels[0] == 0 and img[3:5, 3:5].sum() < img[3:5, 1:3].sum()


def test_multinomial_naive_bayes():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.2, 0.7]])
    y = torch.randint(0, 2, (400,), generator=g)
    x = torch.stack([torch.multinomial(p[c], 30, replacement=True, generator=g).bincount(
        minlength=3) for c in y]).float()
    pred = baselines.multinomial_naive_bayes(x[:300], y[:300], x[300:], 2)
    assert float((pred == y[300:]).double().mean()) > 0.99
    # the estimated class distributions are the Laplace-smoothed frequencies
    Y = torch.nn.functional.one_hot(y[:300], 2).double()
    theta = (Y.T @ x[:300].double() + 1)
    theta = theta / theta.sum(-1, keepdim=True)
    manual = (x[300:].double() @ theta.log().T + (Y.mean(0)).log()).argmax(-1)
    assert torch.equal(pred, manual)


def test_cli_single_dm_saves_params(tmp_path, capsys):
    alpha = torch.rand(5, dtype=torch.float64) + 0.5
    x = DirichletMultinomial(torch.randint(10, 50, (200,)), alpha).sample().numpy()
    np.save(tmp_path / "c.npy", x)
    out = tmp_path / "p.npz"
    assert cli.main(["fit", str(tmp_path / "c.npy"), "--device", "cpu",
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "200 rows x 5 categories" in text and "Dirichlet-multinomial fit (newton)" in text
    saved = np.load(out)
    ref = fit(torch.from_numpy(x).float())
    np.testing.assert_allclose(saved["alpha"], ref.alpha.numpy(), rtol=1e-10)
    assert math.isclose(float(saved["log_lik"]), ref.log_lik, rel_tol=1e-12)
    assert bool(saved["converged"])


def test_cli_mixture_with_labels(tmp_path, capsys):
    K, V = 2, 8
    alpha = torch.full((K, V), 0.5, dtype=torch.float64)
    alpha[0, :4] = alpha[1, 4:] = 5.0
    z = torch.randint(0, K, (300,))
    x = DirichletMultinomial(torch.randint(30, 60, (300,)), alpha[z]).sample().numpy()
    np.savetxt(tmp_path / "c.csv", x, delimiter=",", fmt="%d")
    (tmp_path / "y.txt").write_text("\n".join(["left", "right"][i] for i in z.tolist()))
    out = tmp_path / "m.npz"
    rc = fit_cli.main([str(tmp_path / "c.csv"), "--k", "2", "--labels", str(tmp_path / "y.txt"),
                       "--out", str(out), "--n-init", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "2-component DM mixture" in text and "BIC" in text
    assert "adjusted Rand index" in text and "naive Bayes" in text
    acc = [float(a) for a in re.findall(r"accuracy ([\d.]+)", text)]
    m = re.search(r"difference ([+-][\d.]+), paired standard error ([\d.]+) over (\d+) "
                  r"test rows \((\d+) classified differently\)", text)
    assert m is not None and len(acc) == 2
    diff, se, n_te, disc = float(m[1]), float(m[2]), int(m[3]), int(m[4])
    assert abs(diff - (acc[0] - acc[1])) < 2e-4 and 0 <= disc <= n_te
    assert abs(se - disc ** 0.5 / n_te) < 1e-4 and abs(diff) <= disc / n_te + 1e-4
    saved = np.load(out)
    assert saved["log_alpha"].shape == (2, V) and saved["weights"].shape == (2,)
    assert float(saved["classifier_accuracy"]) > 0.95
    assert saved["assignments"].shape == (300,)


def test_cli_errors(tmp_path, capsys):
    np.save(tmp_path / "neg.npy", -np.ones((3, 3)))
    assert fit_cli.main([str(tmp_path / "neg.npy")]) == 2
    assert "negative count" in capsys.readouterr().err
    assert fit_cli.main([str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    np.save(tmp_path / "ok.npy", np.ones((3, 3)))
    assert fit_cli.main([str(tmp_path / "ok.npy"), "--k", "0"]) == 2


@pytest.mark.parametrize("stored", [np.float32, np.float64, np.int64])
def test_sparse_load_checks_name_the_entry_and_keep_the_stored_parts(tmp_path, stored):
    rng = np.random.default_rng()
    x = rng.poisson(2.0, size=(40, 9)) * (rng.random((40, 9)) < 0.4)
    x[[3, 4, 5]] = 0                                     # empty rows before the bad entry
    x[0, 0] += 1
    m = scipy.sparse.csr_matrix(x.astype(stored))
    p = tmp_path / "ok.npz"
    scipy.sparse.save_npz(p, m)
    sc = load_counts(p)
    assert sc.values.dtype == torch.float32 and sc.col_indices.dtype == torch.int32
    np.testing.assert_array_equal(sc.to_dense().numpy(), x)
    if stored == np.float32:       # the values as stored: no conversion, no copy kept
        assert sc.values.numpy().dtype == np.float32
    bad = x.astype(np.float64)
    i, j = 6, int(rng.integers(0, 9))
    cases = [(-2.0, "negative count -2.0 at row 7, column %d" % (j + 1), {})]
    if stored != np.int64:
        cases += [(np.nan, "non-finite value nan at row 7", {}),
                  (1.5, "non-integer count 1.5 at row 7", dict(require_integer=True))]
    for n, (value, match, kw) in enumerate(cases):
        b = bad.copy()
        b[i, j] = value
        q = tmp_path / f"bad{n}.npz"
        scipy.sparse.save_npz(q, scipy.sparse.csr_matrix(b.astype(stored)))
        with pytest.raises(ValueError, match=match):
            load_counts(q, **kw)


def test_sparse_load_checks_in_blocks_report_the_first_bad_value_and_all(tmp_path, monkeypatch):
    """The checks go a block of stored values at a time: the error names the
    first bad value of the first rule broken and counts that rule's bad
    values over every block."""
    from dirmult_ext.data import io
    rng = np.random.default_rng()
    x = (rng.poisson(2.0, size=(60, 11)) + 1.0) * (rng.random((60, 11)) < 0.5)
    m = scipy.sparse.csr_matrix(x)
    monkeypatch.setattr(io, "CHECK_BLOCK", int(rng.integers(3, 9)))
    nnz = m.nnz
    at = np.sort(rng.choice(np.arange(nnz // 3, nnz), size=4, replace=False))
    bad = m.copy()
    bad.data[at[0]], bad.data[at[2]] = 2.5, 3.5              # non-integer, earliest
    bad.data[at[1]], bad.data[at[3]] = -1.0, np.inf          # negative, then non-finite
    p = tmp_path / "bad.npz"
    scipy.sparse.save_npz(p, bad)
    row = int(np.searchsorted(m.indptr, at[3], side="right")) - 1
    with pytest.raises(ValueError, match=rf"non-finite value inf at row {row + 1}, column "
                       rf"{m.indices[at[3]] + 1} \(1 in all\)"):
        load_counts(p, require_integer=True)
    bad.data[at[3]] = -4.0
    scipy.sparse.save_npz(p, bad)
    row = int(np.searchsorted(m.indptr, at[1], side="right")) - 1
    with pytest.raises(ValueError, match=rf"negative count -1.0 at row {row + 1}, column "
                       rf"{m.indices[at[1]] + 1} \(2 in all\)"):
        load_counts(p, require_integer=True)
    bad.data[at[1]] = bad.data[at[3]] = 7.0
    scipy.sparse.save_npz(p, bad)
    row = int(np.searchsorted(m.indptr, at[0], side="right")) - 1
    with pytest.raises(ValueError, match=rf"non-integer count 2.5 at row {row + 1}, column "
                       rf"{m.indices[at[0]] + 1} \(2 in all\)"):
        load_counts(p, require_integer=True)
    ok = load_counts(p)                                      # fractions allowed
    np.testing.assert_array_equal(ok.to_dense().numpy(), bad.toarray())
    big = m.copy()
    big.data[at[2]] = 2.0 ** 25
    scipy.sparse.save_npz(p, big)
    with pytest.raises(ValueError, match="exceed 2\\^24"):
        load_counts(p)


@pytest.mark.parametrize("field", ["integer", "real"])
def test_mtx_values_narrowed_before_the_csr_conversion_only_when_exact(tmp_path, field):
    """A Matrix Market file's values go to float32 before its COO entries
    become CSR only where float32 holds them exactly (whole, 0..2^24): the
    loaded counts and every check then see the file's values."""
    from dirmult_ext.data import io
    rng = np.random.default_rng()
    x = rng.poisson(3.0, size=(40, 9)) * (rng.random((40, 9)) < 0.4)
    x[0, 0] = 2 ** 24                                 # the largest exact count
    m = scipy.sparse.coo_matrix(x.astype(np.int64 if field == "integer" else np.float64))
    scipy.io.mmwrite(str(tmp_path / "x.mtx"), m, field=field)
    assert io._exact_in_float32(scipy.io.mmread(str(tmp_path / "x.mtx")).data)
    sc = load_counts(tmp_path / "x.mtx", require_integer=True)
    assert sc.values.dtype == torch.float32
    np.testing.assert_array_equal(sc.to_dense().numpy(), x)
    i, j = int(rng.integers(1, 40)), int(rng.integers(0, 9))
    for value, match in [(2 ** 24 + 1, "exceed 2\\^24"), (-3, "negative count -3.0 at row "
                                                            f"{i + 1}, column {j + 1}")] + (
            [(2.5, f"non-integer count 2.5 at row {i + 1}, column {j + 1}")]
            if field == "real" else []):
        bad = x.astype(np.float64)
        bad[i, j] = value
        m = scipy.sparse.coo_matrix(bad.astype(np.int64) if field == "integer" else bad)
        scipy.io.mmwrite(str(tmp_path / "bad.mtx"), m, field=field)
        assert not io._exact_in_float32(scipy.io.mmread(str(tmp_path / "bad.mtx")).data)
        with pytest.raises(ValueError, match=match):
            load_counts(tmp_path / "bad.mtx", require_integer=True)
    big = x.astype(np.int64)
    big[i, j] = 2 ** 24 + 1                            # kept exact in float64
    scipy.io.mmwrite(str(tmp_path / "big.mtx"), scipy.sparse.coo_matrix(big), field=field)
    sc = load_counts(tmp_path / "big.mtx", dtype=torch.float64)
    assert sc.values.dtype == torch.float64
    np.testing.assert_array_equal(sc.to_dense().numpy(), big)
