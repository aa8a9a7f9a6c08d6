"""Hostile inputs: every bad argument, file or command line gets the
package's own clear error naming what is wrong (the CLI: one line on stderr,
exit 2), and extreme but valid inputs get the exact answer."""
import math
import os

import mpmath
import numpy as np
import pytest
import torch

import dirmult_ext
from dirmult_ext import DirichletMultinomial, DMClassifier, fit_mixture, io
from dirmult_ext import cli
from dirmult_ext.cli import fit as fit_cli, regress as regress_cli
from dirmult_ext.io import CountFileError


def _counts(B=12, V=4, seed=None):
    g = np.random.default_rng(seed)
    x = g.integers(0, 9, size=(B, V))
    x[:, 0] += 1        # no empty row
    return x


# ----------------------------------------------------------------- the distribution
def test_validate_args_rejects_infinite_concentration():
    for kw in (dict(log_concentration=torch.tensor([0.0, math.inf, 0.0])),
               dict(log_concentration=torch.tensor([0.0, -math.inf, 0.0])),
               dict(concentration=torch.tensor([1.0, math.inf, 1.0]))):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=f"^{name} must be finite"):
            DirichletMultinomial(5, validate_args=True, **kw)


def test_total_count_exact_as_int64():
    d = DirichletMultinomial(2 ** 24 + 1, torch.ones(3))
    assert d.total_count.dtype == torch.int64 and int(d.total_count) == 2 ** 24 + 1
    d = DirichletMultinomial(torch.tensor([2 ** 40 + 1, 3]), torch.ones(2, 3))
    assert d.total_count.tolist() == [2 ** 40 + 1, 3]


@pytest.mark.parametrize("total", [10 ** 9, 2 ** 24 + 1, 2 ** 53 + 3])
def test_large_total_samples_sum_exactly(total):
    V = 4
    alpha = torch.rand(V, dtype=torch.float32) + 0.5
    d = DirichletMultinomial(total, alpha, validate_args=True)
    s = d.sample((3,))
    # float64 holds the integers up to 2^53; past that, int64
    assert s.dtype == (torch.float64 if total <= 2 ** 53 else torch.int64)
    exact = s.to(torch.int64)
    assert (exact >= 0).all() and exact.sum(-1).tolist() == [total] * 3
    assert torch.equal(exact.to(s.dtype), s)
    if total <= 2 ** 53:
        # its own log_prob accepts them, and agrees with mpmath
        lp = d.log_prob(s)
        a = [mpmath.mpf(float(x)) for x in alpha]
        for row, got in zip(exact.tolist(), lp.tolist()):
            ref = (mpmath.loggamma(total + 1) + mpmath.loggamma(sum(a))
                   - mpmath.loggamma(total + sum(a))
                   + sum(mpmath.loggamma(n + x) - mpmath.loggamma(x) - mpmath.loggamma(n + 1)
                         for n, x in zip(row, a)))
            # the log-gammas of about N log N cancel: float64's rounding of those
            tol = 64 * np.finfo(np.float64).eps * total * math.log(total)
            assert got == pytest.approx(float(ref), abs=tol)


def test_small_total_samples_keep_concentration_dtype():
    for dt in (torch.float32, torch.float64):
        s = DirichletMultinomial(7, torch.rand(3, dtype=dt) + 0.5).sample((4,))
        assert s.dtype == dt and s.sum(-1).tolist() == [7.0] * 4


@pytest.mark.parametrize("total", [-3, float("nan"), float("inf"), 2.5])
def test_sample_rejects_bad_total_without_validation(total):
    d = DirichletMultinomial(total, torch.ones(3), validate_args=False)
    with pytest.raises(ValueError, match="total_count"):
        d.sample()


def test_negative_alpha_named_as_such():
    with pytest.raises(ValueError, match="alpha must be positive"):
        dirmult_ext.log_lik(torch.tensor([[1.0, 2.0, 0.0]]), alpha=torch.tensor([-1.0, 1, 1]),
                            validate=True)


# ----------------------------------------------------------------- arguments
@pytest.mark.parametrize("k", ["12", b"12", 2.0, [1, "2"], [1.5, 2], None, True])
def test_fit_mixture_rejects_k_that_is_not_integers(k):
    with pytest.raises(TypeError, match=r"^k must"):
        fit_mixture(torch.as_tensor(_counts(), dtype=torch.float64), k, max_iter=2)


@pytest.mark.parametrize("k", [0, [], [2, 2], [0, 1]])
def test_fit_mixture_rejects_bad_k_values(k):
    with pytest.raises(ValueError, match=r"^k must"):
        fit_mixture(torch.as_tensor(_counts(), dtype=torch.float64), k, max_iter=2)


@pytest.mark.parametrize("seed", ["abc", "3", 1.5, True])
def test_fit_mixture_rejects_bad_seed(seed):
    with pytest.raises(TypeError, match=r"^seed must be an integer"):
        fit_mixture(torch.as_tensor(_counts(), dtype=torch.float64), 2, seed=seed, max_iter=2)


def test_cuda_device_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    c = torch.as_tensor(_counts(), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^device 'cuda': torch sees no CUDA device"):
        fit_mixture(c, 2, device="cuda", max_iter=2)
    with pytest.raises(ValueError, match=r"^device 'cuda:0': torch sees no CUDA device"):
        dirmult_ext.fit(c, device="cuda:0")


@pytest.mark.parametrize("device", ["tpu7", "gpu", ""])
def test_unknown_device_name(device):
    with pytest.raises(ValueError, match=r"^device must be a device such as"):
        fit_mixture(torch.as_tensor(_counts(), dtype=torch.float64), 2, device=device,
                    max_iter=2)


@pytest.mark.parametrize("labels", [
    lambda y: np.where(np.arange(len(y)) == 3, np.nan, y.astype(float)),
    lambda y: torch.where(torch.arange(len(y)) == 0, torch.nan, torch.as_tensor(y).double()),
    lambda y: np.array([None] + ["a"] * (len(y) - 1), dtype=object)])
def test_classifier_rejects_missing_labels(labels):
    x = _counts(B=12)
    y = np.arange(12) % 2
    with pytest.raises(ValueError, match=r"^labels has 1 missing value"):
        DMClassifier().fit(torch.as_tensor(x, dtype=torch.float64), labels(y))


# ----------------------------------------------------------------- files
def _write_table(path, rows, sep=",", bom=False):
    text = "\n".join(sep.join(map(str, r)) for r in rows) + "\n"
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())


def test_bom_numeric_table(tmp_path):
    x = _counts()
    _write_table(tmp_path / "c.csv", x.tolist(), bom=True)
    got = io.load_counts(tmp_path / "c.csv", dtype=torch.float64)
    np.testing.assert_array_equal(got.numpy(), x)


def test_bom_taxa_table(tmp_path):
    x = _counts(B=5, V=3)
    rows = [["Taxon"] + [f"s{i}" for i in range(5)]]
    rows += [[f"t{j}"] + x[:, j].tolist() for j in range(3)]
    _write_table(tmp_path / "t.csv", rows, bom=True)
    t = io.load_count_table(tmp_path / "t.csv", dtype=torch.float64)
    assert t.transposed and t.sample_names == [f"s{i}" for i in range(5)]
    assert t.feature_names == ["t0", "t1", "t2"]
    np.testing.assert_array_equal(t.counts.numpy(), x)


@pytest.mark.parametrize("sep", [";", "\t"])
@pytest.mark.parametrize("header", [False, True])
def test_csv_separator_detected(tmp_path, sep, header):
    x = _counts()
    rows = ([[f"v{j}" for j in range(x.shape[1])]] if header else []) + x.tolist()
    _write_table(tmp_path / "c.csv", rows, sep=sep)
    t = io.load_count_table(tmp_path / "c.csv", dtype=torch.float64)
    np.testing.assert_array_equal(t.counts.numpy(), x)
    if header:
        assert t.feature_names == [f"v{j}" for j in range(x.shape[1])]


def test_mixed_separators_named(tmp_path):
    (tmp_path / "m.csv").write_text("1;2;3\n4;5\n")
    with pytest.raises(CountFileError, match=r"m\.csv: expected comma-separated values.*"
                                             r"semicolons"):
        io.load_counts(tmp_path / "m.csv")


def _bad_files(tmp_path):
    """name -> (file maker, what the message says)."""
    x = _counts()
    garbage = np.random.default_rng().integers(0, 256, 512, dtype=np.uint8).tobytes()
    garbage = b"\xff\xfe\x00" + garbage  # (never valid UTF-8, never a known signature)

    def truncated_npz(p):
        np.savez(tmp_path / "full.npz", counts=x)
        b = (tmp_path / "full.npz").read_bytes()
        p.write_bytes(b[: len(b) // 2])

    def truncated_mtx(p):
        scipy_io = pytest.importorskip("scipy.io", reason="Matrix Market needs scipy")
        import scipy.sparse
        scipy_io.mmwrite(tmp_path / "full.mtx", scipy.sparse.coo_matrix(x))
        b = (tmp_path / "full.mtx").read_bytes()
        p.write_bytes(b[: len(b) * 2 // 3])

    def short_indptr(p):
        h5py = pytest.importorskip("h5py", reason=".h5ad needs h5py")
        import scipy.sparse
        m = scipy.sparse.csr_matrix(x)
        with h5py.File(p, "w") as f:
            g = f.create_group("X")
            g.attrs["encoding-type"] = "csr_matrix"
            g.attrs["shape"] = x.shape
            g["data"], g["indices"], g["indptr"] = m.data, m.indices, m.indptr[:-2]

    def garbage_file(p):
        if p.suffix == ".h5ad":
            pytest.importorskip("h5py", reason=".h5ad needs h5py")
        if p.suffix == ".mtx":
            pytest.importorskip("scipy.io", reason="Matrix Market needs scipy")
        p.write_bytes(garbage)

    def directory(p):
        pytest.importorskip("h5py", reason=".h5ad needs h5py")
        p.mkdir()

    return {
        "trunc.npz": (truncated_npz, "truncated or corrupt"),
        "trunc.mtx": (truncated_mtx, "Matrix Market"),
        "garbage.csv": (garbage_file, "not a text table"),
        "garbage.h5ad": (garbage_file, "not an HDF5 file"),
        "garbage.mtx": (garbage_file, "Matrix Market"),
        "garbage.npy": (garbage_file, "no NumPy header"),
        "garbage.npz": (garbage_file, "no NumPy header"),
        "x.h5ad": (directory, "is a directory"),
        "short.h5ad": (short_indptr, "indptr has 11 entries, expected 13"),
    }


BAD_FILES = ["trunc.npz", "trunc.mtx", "garbage.csv", "garbage.h5ad", "garbage.mtx",
             "garbage.npy", "garbage.npz", "x.h5ad", "short.h5ad"]


@pytest.mark.parametrize("name", BAD_FILES)
@pytest.mark.parametrize("sparse", [None, True, False])
def test_bad_count_file(tmp_path, name, sparse):
    make, what = _bad_files(tmp_path)[name]
    p = tmp_path / name
    make(p)
    with pytest.raises(CountFileError) as e:
        io.load_counts(p, sparse=sparse)
    msg = str(e.value)
    assert msg.startswith(str(p)) and what in msg, msg
    assert "pickle" not in msg


@pytest.mark.parametrize("name", ["garbage.csv", "garbage.npy"])
def test_bad_label_and_covariate_files(tmp_path, name):
    make, _ = _bad_files(tmp_path)[name]
    p = tmp_path / name
    make(p)
    for load in (io.load_labels, io.load_covariates):
        with pytest.raises(CountFileError, match="^" + str(p).replace("\\", "\\\\")) as e:
            load(p)
        assert "pickle" not in str(e.value)


# ----------------------------------------------------------------- the command line
def _run(main, argv, capsys):
    """(exit status, stdout, stderr) of a CLI's main(argv), in process."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_one_line_error(rc, err, prog, *words):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dirmult-ext {prog}: error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.fixture
def counts_csv(tmp_path):
    _write_table(tmp_path / "c.csv", _counts(B=20).tolist())
    return str(tmp_path / "c.csv")


@pytest.mark.parametrize("extra, words", [
    (["--tol", "-1"], ["--tol", "-1"]),
    (["--tol", "nan"], ["--tol"]),
    (["--batch-size", "0"], ["--batch-size", "0"]),
    (["--test-fraction", "2"], ["--test-fraction", "2"]),
    (["--device", "tpu7"], ["--device", "tpu7"]),
    (["--k", "0"], ["--k"]),
])
def test_fit_cli_bad_option(counts_csv, capsys, extra, words):
    rc, out, err = _run(fit_cli.main, [counts_csv, "--device", "cpu"] + extra, capsys)
    _assert_one_line_error(rc, err, "fit", *words)
    assert "log-likelihood" not in out     # caught before any fit


def test_fit_cli_cuda_without_gpu(counts_csv, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, _, err = _run(fit_cli.main, [counts_csv, "--device", "cuda"], capsys)
    _assert_one_line_error(rc, err, "fit", "--device", "no CUDA device")


@pytest.mark.parametrize("content", [b"1", b"x", b"\n", b"\xff"])
def test_fit_cli_tiny_file(tmp_path, capsys, content):
    (tmp_path / "tiny.csv").write_bytes(content)
    rc, _, err = _run(cli.main, ["fit", str(tmp_path / "tiny.csv"), "--device", "cpu"], capsys)
    _assert_one_line_error(rc, err, "fit")


@pytest.mark.parametrize("name", ["garbage.csv", "trunc.npz", "garbage.npy"])
def test_fit_cli_bad_file(tmp_path, capsys, name):
    make, what = _bad_files(tmp_path)[name]
    make(tmp_path / name)
    rc, _, err = _run(fit_cli.main, [str(tmp_path / name), "--device", "cpu"], capsys)
    _assert_one_line_error(rc, err, "fit", name, what)


def test_fit_cli_reads_bom_taxa_table(tmp_path, capsys):
    x = _counts(B=6, V=3)
    rows = [["Taxon"] + [f"s{i}" for i in range(6)]]
    rows += [[f"t{j}"] + x[:, j].tolist() for j in range(3)]
    _write_table(tmp_path / "t.csv", rows, bom=True)
    rc, out, _ = _run(fit_cli.main, [str(tmp_path / "t.csv"), "--device", "cpu",
                                     "--out", str(tmp_path / "r.npz")], capsys)
    assert rc == 0 and "(samples in columns: transposed)" in out
    assert f"6 rows x 3 categories, {int(x.sum())} counts" in out
    assert list(np.load(tmp_path / "r.npz")["feature_names"]) == ["t0", "t1", "t2"]


@pytest.mark.parametrize("out", ["file/x.npz", "file/dir", "file"])
def test_fit_cli_unwritable_out_before_fit(tmp_path, counts_csv, capsys, out):
    (tmp_path / "file").write_text("a file, not a directory")
    target = str(tmp_path / out)
    if out == "file":
        target = str(tmp_path / "file" / "x.npz")
    rc, stdout, err = _run(fit_cli.main, [counts_csv, "--device", "cpu", "--out", target],
                           capsys)
    _assert_one_line_error(rc, err, "fit", "--out", target, "cannot write there")
    assert "log-likelihood" not in stdout


@pytest.mark.parametrize("k", ["1", "2"])
def test_fit_cli_failed_save_keeps_results(tmp_path, counts_csv, capsys, monkeypatch, k):
    def fail(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fit_cli, "_save", fail)
    rc, out, err = _run(fit_cli.main, [counts_csv, "--device", "cpu", "--k", k, "--seed", "1",
                                       "--out", str(tmp_path / "r.npz")], capsys)
    _assert_one_line_error(rc, err, "fit", "No space left", "saved instead to")
    saved = err.split("saved instead to: ")[1].split(",")[0].strip()
    assert "log-likelihood" in out and os.path.isfile(saved)
    try:
        z = np.load(saved)
        assert np.isfinite(z["log_alpha"]).all() and z["log_alpha"].shape[-1] == 4
    finally:
        import shutil
        shutil.rmtree(os.path.dirname(saved))


@pytest.fixture
def regress_files(tmp_path):
    _write_table(tmp_path / "c.csv", _counts(B=20).tolist())
    g = np.random.default_rng()
    _write_table(tmp_path / "x.csv", [["x1"]] + [[f"{v:.6f}"] for v in g.normal(size=20)])
    return str(tmp_path / "c.csv"), str(tmp_path / "x.csv")


@pytest.mark.parametrize("extra, words", [
    (["--tol", "-1"], ["--tol"]),
    (["--batch-size", "0"], ["--batch-size"]),
    (["--max-iter", "0"], ["--max-iter"]),
    (["--device", "tpu7"], ["--device", "tpu7"]),
    (["--out", "FILE/c.csv"], ["--out", "cannot write there"]),
])
def test_regress_cli_bad_option(tmp_path, regress_files, capsys, extra, words):
    (tmp_path / "FILE").write_text("a file")
    extra = [e.replace("FILE", str(tmp_path / "FILE")) for e in extra]
    rc, out, err = _run(regress_cli.main, list(regress_files) + ["--device", "cpu"] + extra,
                        capsys)
    _assert_one_line_error(rc, err, "regress", *words)
    assert "estimate" not in out


def test_argparse_errors_exit_2(counts_csv, capsys):
    rc, _, err = _run(fit_cli.main, [counts_csv, "--batch-size", "zero"], capsys)
    assert rc == 2 and "--batch-size" in err
