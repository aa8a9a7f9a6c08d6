"""The mixture workflow of ``dirmult-ext fit``: the thread count of small
fits, the multinomial baseline, empty samples, 1-based positions in load
errors, ``--k 1 --prior dmn``, ``--rows`` and the digits' model-selection
default."""
import math
import re

import numpy as np
import pytest
import scipy.io
import scipy.sparse
import scipy.stats
import torch

import dirmult_ext
from dirmult_ext.cli import fit as fit_cli
from dirmult_ext.data import threads
from dirmult_ext.models.criteria import multinomial_log_lik
from dirmult_ext.likelihood.distribution import DirichletMultinomial
from dirmult_ext.data.io import load_count_table, load_counts
from dirmult_ext.models.mixture import fit_mixture


def rng():
    return np.random.default_rng(int(torch.randint(0, 2 ** 31, ())))


def dm_table(B=120, V=7, scale=2.0):
    alpha = torch.rand(V, dtype=torch.float64) * scale + 0.3
    return DirichletMultinomial(torch.randint(20, 80, (B,)), alpha).sample().numpy()


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------
@pytest.fixture
def two_threads(monkeypatch):
    """torch at 2 threads, taken as its default; set_num_threads recorded."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_IMPORT_THREADS", 2)
    monkeypatch.delenv("DIRMULT_FIT_THREADS", raising=False)
    calls = []
    real = torch.set_num_threads

    def spy(n):
        calls.append(n)
        real(n)
    monkeypatch.setattr(torch, "set_num_threads", spy)
    yield calls
    real(before)


def test_small_fits_run_on_one_thread(two_threads):
    x = torch.from_numpy(dm_table())
    y = torch.randint(0, 2, (x.shape[0],))
    for run in (lambda: dirmult_ext.fit(x), lambda: fit_mixture(x, 2, n_init=1, seed=0),
                lambda: dirmult_ext.DMClassifier().fit(x, y),
                lambda: dirmult_ext.fit_regression(x[:50], torch.randn(50, 1), se=False, max_iter=20),
                lambda: fit_mixture(x, [1, 2], n_init=1, n_screen=0, seed=0)):
        two_threads.clear()
        run()
        # one switch to 1 thread and one restore, also for a table of k
        assert two_threads == [1, 2]
        assert torch.get_num_threads() == 2


def test_thread_rule_and_overrides(two_threads, monkeypatch):
    small, large = threads.SMALL_WORK - 1, threads.SMALL_WORK
    assert threads.threads_for(small) == 1 and threads.threads_for(large) is None
    assert threads.threads_for(small, "cuda") is None
    with threads.fit_threads(small):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="boom"):  # restored on an exception too
        with threads.fit_threads(small):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2
    # a count the caller chose is left alone
    monkeypatch.setattr(threads, "_IMPORT_THREADS", 4)
    assert threads.threads_for(small) is None
    monkeypatch.setattr(threads, "_IMPORT_THREADS", 2)
    monkeypatch.setenv("DIRMULT_FIT_THREADS", "default")
    assert threads.threads_for(small) is None
    monkeypatch.setenv("DIRMULT_FIT_THREADS", "3")
    assert threads.threads_for(large) == 3
    two_threads.clear()
    dirmult_ext.fit(torch.from_numpy(dm_table(B=40)))
    assert two_threads == [3, 2]
    for bad in ("0", "many"):
        monkeypatch.setenv("DIRMULT_FIT_THREADS", bad)
        with pytest.raises(ValueError, match="DIRMULT_FIT_THREADS"):
            threads.threads_for(small)


# ---------------------------------------------------------------------------
# the multinomial baseline
# ---------------------------------------------------------------------------
def test_multinomial_log_lik_matches_scipy():
    x = rng().poisson(2.0, size=(40, 6)).astype(np.float64)
    x[5] = 0
    x[:, 3] = 0
    p = x.sum(0) / x.sum()
    ref = sum(scipy.stats.multinomial.logpmf(r, r.sum(), p) for r in x if r.sum() > 0)
    t = torch.from_numpy(x)
    assert multinomial_log_lik(t) == pytest.approx(ref, rel=1e-12)
    sc = dirmult_ext.SparseCounts.from_dense(t)
    assert multinomial_log_lik(sc) == pytest.approx(ref, rel=1e-12)



def test_multinomial_log_lik_of_fractional_and_large_counts():
    """Counts off the histogram (fractions, counts above HISTOGRAM_COUNTS)
    take a log-gamma per value; the sum against float64 math.lgamma."""
    from dirmult_ext.models import criteria
    r = rng()
    x = r.poisson(3.0, size=(30, 5)) * (r.random((30, 5)) < 0.6) + 0.0
    x[::7] += r.random((5,)).round(3)
    x[3, 2] = criteria.HISTOGRAM_COUNTS + r.integers(1, 100)
    T = x.sum(0)
    ref = math.fsum(math.lgamma(n + 1) for n in x.sum(1)) - math.fsum(
        math.lgamma(v + 1) for v in x.ravel()) + math.fsum(
        t * math.log(t / T.sum()) for t in T if t > 0)
    t = torch.from_numpy(x)
    assert multinomial_log_lik(t) == pytest.approx(ref, rel=1e-12)
    assert multinomial_log_lik(dirmult_ext.SparseCounts.from_dense(t)) == pytest.approx(
        ref, rel=1e-12)
    assert multinomial_log_lik(t, t.sum(-1)) == multinomial_log_lik(t)

def _number(text, before):
    return float(re.search(re.escape(before) + r" (-?[0-9.]+)", text).group(1))


def test_cli_baseline_and_multinomial_limit(tmp_path, capsys):
    over = dm_table(scale=1.0)                      # overdispersed: DM beats multinomial
    np.save(tmp_path / "over.npy", over)
    assert fit_cli.main([str(tmp_path / "over.npy"), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    base = text.split("baseline, one multinomial")[1].splitlines()[0]
    assert _number(base, "log-likelihood") == pytest.approx(
        multinomial_log_lik(torch.from_numpy(over)), abs=1e-4)
    dm_line = text.split("precision A")[1].splitlines()[0]
    assert _number(dm_line, "BIC") < _number(base, "BIC")
    assert "(normalized pmf)" in text.split("Dirichlet-multinomial fit")[1].splitlines()[0]
    assert re.search(r"BIC -?\d+\.\d, AIC -?\d+\.\d ", dm_line), dm_line   # one decimal
    assert "multinomial limit" not in text
    # rows of one exact proportion (less spread than a multinomial's): the DM's
    # MLE is its multinomial limit (multinomial samples reach it only about
    # half the time, when they happen to be underdispersed)
    r = rng()
    mult = (r.integers(1, 10, size=6)[None, :] * r.integers(1, 6, size=(300, 1))).astype(float)
    np.save(tmp_path / "mult.npy", mult)
    assert fit_cli.main([str(tmp_path / "mult.npy"), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "no overdispersion: the DM has reached its multinomial limit" in text
    # mixtures: the baseline on dmn's half scale
    assert fit_cli.main([str(tmp_path / "over.npy"), "--k", "2", "--n-init", "1",
                         "--n-screen", "0", "--max-iter", "30"]) == 0
    text = capsys.readouterr().out
    base = text.split("baseline, one multinomial")[1].splitlines()[0]
    ll = multinomial_log_lik(torch.from_numpy(over))
    assert "dmn's half scale" in base
    assert _number(base, "AIC") == pytest.approx(-ll + over.shape[1] - 1, abs=0.06)


# ---------------------------------------------------------------------------
# errors and warnings
# ---------------------------------------------------------------------------
def test_cli_warns_once_about_empty_samples(tmp_path, capsys):
    x = dm_table(B=60)
    n_empty = int(rng().integers(2, 6))
    x[rng().choice(60, n_empty, replace=False)] = 0
    np.save(tmp_path / "z.npy", x)
    assert fit_cli.main([str(tmp_path / "z.npy"), "--k", "1-2", "--n-init", "1",
                         "--n-screen", "0", "--max-iter", "20"]) == 0
    err = capsys.readouterr().err
    msg = f"{n_empty} samples have no counts; they add 0 to the log-likelihood"
    assert err.count(msg) == 1, err
    x[0] = 1
    np.save(tmp_path / "ok.npy", x[x.sum(1) > 0])
    assert fit_cli.main([str(tmp_path / "ok.npy")]) == 0
    assert "no counts" not in capsys.readouterr().err


def test_load_errors_name_1_based_positions(tmp_path, capsys):
    r = rng()
    x = r.poisson(3.0, size=(8, 5)).astype(np.float64)
    i, j = int(r.integers(8)), int(r.integers(5))
    bad = x.copy()
    bad[i, j] = -3
    np.save(tmp_path / "a.npy", bad)
    assert fit_cli.main([str(tmp_path / "a.npy")]) == 2
    assert f"negative count -3.0 at row {i + 1}, column {j + 1} " in capsys.readouterr().err
    scipy.io.mmwrite(str(tmp_path / "a.mtx"), scipy.sparse.coo_matrix(bad))
    with pytest.raises(ValueError, match=f"at row {i + 1}, column {j + 1} "):
        load_counts(tmp_path / "a.mtx")
    # csv with a header and a name column: the file's line and column
    lines = ["sample," + ",".join(f"g{v}" for v in range(5))]
    lines += [f"s{b}," + ",".join(f"{v:g}" for v in row) for b, row in enumerate(bad)]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"at line {i + 2}, column {j + 2} "):
        load_count_table(tmp_path / "a.csv")
    # taxa x samples: transposed on reading, positions still the file's
    lines = ["Taxon," + ",".join(f"s{b}" for b in range(8))]
    lines += [f"t{v}," + ",".join(f"{c:g}" for c in bad[:, v]) for v in range(5)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"at line {j + 2}, column {i + 2} "):
        load_count_table(tmp_path / "t.csv")
    with pytest.raises(ValueError, match=f"at line {j + 2}, column {i + 2} "):
        load_count_table(tmp_path / "t.csv", sparse=True)
    nan = x.copy()
    nan[i, j] = np.nan
    np.save(tmp_path / "n.npy", nan)
    with pytest.raises(ValueError, match=f"nan at row {i + 1}, column {j + 1} "):
        load_counts(tmp_path / "n.npy")


def test_cli_k1_prior_dmn_is_applied(tmp_path, capsys):
    x = dm_table(B=80, V=6)
    np.save(tmp_path / "c.npy", x)
    out = tmp_path / "r.npz"
    assert fit_cli.main([str(tmp_path / "c.npy"), "--k", "1", "--prior", "dmn",
                         "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1-component DM mixture (EM, MAP under dmn's Gamma(0.1, 0.1) prior)" in text
    ref = fit_mixture(torch.from_numpy(x), 1, prior="dmn", seed=0)
    saved = np.load(out)
    np.testing.assert_allclose(saved["log_alpha"], ref.log_alpha.numpy(), rtol=1e-6)
    mle = dirmult_ext.fit(torch.from_numpy(x))
    # the prior pulls the concentrations, so this is not the plain DM fit
    assert not np.allclose(saved["log_alpha"][0], mle.log_alpha.numpy(), rtol=1e-9)


# ---------------------------------------------------------------------------
# --rows and the digits' model-selection default
# ---------------------------------------------------------------------------
def test_cli_rows_fits_a_seeded_subsample(tmp_path, capsys):
    B, n, seed = 90, int(rng().integers(20, 60)), int(rng().integers(0, 1000))
    x = dm_table(B=B, V=6)
    np.save(tmp_path / "c.npy", x)
    (tmp_path / "y.txt").write_text("\n".join(str(v) for v in rng().integers(0, 2, B)))
    out = tmp_path / "r.npz"
    assert fit_cli.main([str(tmp_path / "c.npy"), "--k", "2", "--rows", str(n), "--seed",
                         str(seed), "--n-init", "1", "--labels", str(tmp_path / "y.txt"),
                         "--out", str(out), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert (f"fitted to a random {n} of the {B} rows (--rows {n}, seed {seed}); the "
            "classifier uses every row") in text
    n_test = int(round(B * 0.25))
    assert f"{B - n_test} train / {n_test} test rows" in text
    idx = torch.randperm(B, generator=torch.Generator().manual_seed(seed))[:n].sort().values
    saved = np.load(out)
    assert saved["responsibilities"].shape == (n, 2)
    assert saved["sample_names"].tolist() == [str(i + 1) for i in idx.tolist()]
    ref = fit_mixture(torch.from_numpy(x)[idx].float(), 2, n_init=1, seed=seed)
    np.testing.assert_allclose(saved["log_alpha"], ref.log_alpha.numpy(), rtol=1e-6)
    # as many rows as the data has or more: every row, no subsample line
    assert fit_cli.main([str(tmp_path / "c.npy"), "--rows", str(B + int(rng().integers(0, 9))),
                         "--device", "cpu"]) == 0
    assert "fitted to a random" not in capsys.readouterr().out
    assert fit_cli.main([str(tmp_path / "c.npy"), "--rows", "0"]) == 2
    assert "--rows must be >= 1" in capsys.readouterr().err
    assert fit_cli.main([str(tmp_path / "c.npy"), "--k", "1-9", "--rows", "8"]) == 2
    assert "--k 9 needs at least 9 samples, --rows keeps 8" in capsys.readouterr().err


def test_digits_demo_ends_on_an_interior_k(capsys):
    """The no-FILE run as shipped: the chosen k has a smaller and a larger k
    fitted beside it, both worse by Laplace, the criterion it reports and
    (with the prior) the one the advice trusts."""
    assert fit_cli.main(["--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "1797 rows x 64 categories" in text
    assert fit_cli.DIGITS_ROWS < 1797
    assert (f"fitted to a random {fit_cli.DIGITS_ROWS} of the 1797 rows "
            f"(--rows {fit_cli.DIGITS_ROWS}, seed 0)") in text
    assert "MAP under dmn's Gamma(0.1, 0.1) prior" in text
    ks = fit_cli.parse_k(fit_cli.DIGITS_K)
    rows = [ln.split() for ln in text.splitlines() if re.match(r"\s*\d+\s+-\d+\.\d\d ", ln)]
    assert [int(r[0]) for r in rows] == ks, text
    assert f"model selection, k = {', '.join(map(str, ks))} (MAP" in text
    laplace = {int(r[0]): float(r[2].rstrip("*")) for r in rows}
    chosen = int(re.search(r"chosen k = (\d+) \(Laplace\)", text).group(1))
    assert min(ks) < chosen < max(ks), text
    assert all(laplace[k] > laplace[chosen] for k in ks if k != chosen), text
    assert "largest fitted" not in text and "smallest fitted" not in text
    picks = re.search(r"chosen k by Laplace: (\d+), by BIC: (\d+), by AIC: (\d+)", text)
    if len(set(picks.groups())) > 1:
        assert f"trust Laplace (k = {chosen}), the chosen k\n  why: with the prior" in text
    else:
        assert f"Laplace, BIC and AIC all choose k = {chosen}" in text
    assert f"{chosen}-component DM mixture" in text
    assert re.search(r"adjusted Rand index of clusters vs labels: 0\.\d{4}", text)
    every = re.search(r"\(every k: (.*)\)", text).group(1)
    assert [int(c.split(":")[0]) for c in every.split(", ")] == ks
    # the classifier comparison is on every row
    assert "1348 train / 449 test rows, 10 classes" in text
    acc = [float(line.split("accuracy")[1].split()[0]) for line in text.splitlines()
           if "accuracy" in line]
    assert len(acc) == 2 and all(a > 0.8 for a in acc), text


def test_baseline_on_a_host_thread_while_another_device_fits():
    """For a fit off the CPU the baseline is computed on a host thread of
    its own (the CLI asks for it after the fit); for a CPU fit at once, on
    the calling thread. The same value either way."""
    import threading
    x = torch.from_numpy(rng().poisson(2.0, size=(50, 6)).astype(np.float64))
    ran = []

    def of(counts, N):
        ran.append(threading.current_thread())
        return multinomial_log_lik(counts, N)

    N = x.sum(-1)
    here = fit_cli._baseline(of, x, N, torch.device("cpu"))
    assert here.done() and ran[-1] is threading.current_thread()
    away = fit_cli._baseline(of, x, N, torch.device("cuda"))    # (nothing runs on it)
    assert away.result() == here.result() == multinomial_log_lik(x)
    assert ran[-1] is not threading.current_thread()
