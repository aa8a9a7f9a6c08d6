"""The DM mixture workflow on files: table layouts with names, model
selection from the CLI, the saved tables and the plots."""
import csv
import re
import importlib.util

import numpy as np
import pytest
import torch

from dirmult_ext.cli import fit as fit_cli
from dirmult_ext.data.io import load_count_table, load_counts

from reference import separated_mixture


def random_table(B=40, V=7):
    rng = np.random.default_rng()
    x = rng.poisson(4.0, size=(B, V))
    x[rng.random((B, V)) < 0.3] = 0
    x[:, 0] += 1                                     # no all-zero sample
    return x


def write_table(path, x, sep, corner=None, rows=None, cols=None, comment=None):
    with open(path, "w") as f:
        if comment:
            f.write(comment + "\n")
        if cols is not None:
            f.write(sep.join(([corner] if corner is not None else []) + cols) + "\n")
        for i, r in enumerate(x):
            f.write(sep.join(([rows[i]] if rows is not None else []) + [str(int(v)) for v in r])
                    + "\n")


@pytest.mark.parametrize("sep,suffix", [(",", ".csv"), ("\t", ".tsv")])
def test_taxa_by_samples_with_names(tmp_path, sep, suffix):
    x = random_table()                                  # (samples, taxa)
    samples = [f"S{i}" for i in range(x.shape[0])]
    taxa = [f"Genus_{chr(65 + v)}" for v in range(x.shape[1])]
    p = tmp_path / f"t{suffix}"
    write_table(p, x.T, sep, corner="Taxon", rows=taxa, cols=samples)
    t = load_count_table(p)
    assert t.transposed and t.sample_names == samples and t.feature_names == taxa
    np.testing.assert_array_equal(t.counts.numpy(), x)
    # forced: not transposed, the taxa are then the rows
    t2 = load_count_table(p, samples_in_columns=False)
    assert not t2.transposed and t2.sample_names == taxa and t2.counts.shape == x.T.shape
    # QIIME's layout: a comment line, then "#OTU ID"
    q = tmp_path / f"q{suffix}"
    write_table(q, x.T, sep, corner="#OTU ID", rows=taxa, cols=samples,
                comment="# Constructed from biom file")
    np.testing.assert_array_equal(load_counts(q).numpy(), x)


def test_samples_by_features_layouts(tmp_path):
    x = random_table()
    samples = [f"cell{i}" for i in range(x.shape[0])]
    genes = [f"g{v}" for v in range(x.shape[1])]
    # header with a corner cell that names no taxa: rows are samples
    p = tmp_path / "a.csv"
    write_table(p, x, ",", corner="cell", rows=samples, cols=genes)
    t = load_count_table(p)
    assert not t.transposed and t.sample_names == samples and t.feature_names == genes
    np.testing.assert_array_equal(t.counts.numpy(), x)
    # R's write.csv without the corner cell: the header names only the value columns
    p = tmp_path / "b.csv"
    write_table(p, x, ",", rows=samples, cols=genes)
    t = load_count_table(p)
    assert t.sample_names == samples and t.feature_names == genes
    # numeric names in the first column: only --index-col reads them as names
    p = tmp_path / "c.txt"
    write_table(p, x, " ", rows=[str(1000 + i) for i in range(x.shape[0])])
    assert load_count_table(p).counts.shape == (x.shape[0], x.shape[1] + 1)
    t = load_count_table(p, index_col=True)
    assert t.sample_names[0] == "1000" and t.feature_names == [str(v + 1) for v in range(7)]
    np.testing.assert_array_equal(t.counts.numpy(), x)
    # sparse reading of a transposed table
    p = tmp_path / "d.csv"
    write_table(p, x.T, ",", corner="OTU", rows=genes, cols=samples)
    sc = load_counts(p, sparse=True)
    np.testing.assert_array_equal(sc.to_dense().numpy(), x)


def test_table_errors(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("Taxon,S1,S2\nA,1,2\nB,3,x\n")
    with pytest.raises(ValueError, match="'x' at line 3, column 3"):
        load_count_table(p)
    p.write_text("Taxon,S1,S2,S3,S4\nA,1,2\nB,3,4\n")
    with pytest.raises(ValueError, match="header has 5 names for 2 columns"):
        load_count_table(p)
    p.write_text("Taxon,S1,S2\nA,1,2\nB,3\n")
    with pytest.raises(ValueError, match="line 3 has 1 values"):
        load_count_table(p)
    with pytest.raises(ValueError, match="samples_in_columns"):
        load_count_table(p, samples_in_columns="yes")


def test_cli_model_selection_and_outputs(tmp_path, capsys):
    x, z, _ = separated_mixture(B=150, V=12, K=3, seed=int(torch.randint(0, 10**6, ())))
    x = x.numpy().astype(int)
    samples = [f"S{i}" for i in range(len(x))]
    taxa = [f"Taxon_{v}" for v in range(x.shape[1])]
    p = tmp_path / "gut.csv"
    write_table(p, x.T, ",", corner="Taxon", rows=taxa, cols=samples)
    out = tmp_path / "res"
    rc = fit_cli.main([str(p), "--k", "1-4", "--prior", "dmn", "--n-init", "2",
                       "--out", str(out), "--device", "cpu"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "transposed" in text and "150 rows x 12 categories" in text
    assert "Laplace" in text and "chosen k = 3 (Laplace)" in text
    # components by weight, top taxa printed by name
    lines = [ln for ln in text.splitlines() if ln.strip().startswith(("1:", "2:", "3:"))]
    assert len(lines) == 3 and all("Taxon_" in ln for ln in lines)
    weights = [float(ln.split("weight")[1].split(",")[0]) for ln in lines]
    assert weights == sorted(weights, reverse=True)
    z_np = np.load(out / "dmm.npz")
    assert list(z_np["criteria_k"]) == [1, 2, 3, 4]
    assert list(z_np["sample_names"]) == samples and list(z_np["feature_names"]) == taxa
    R = z_np["responsibilities"]
    assert R.shape == (150, 3) and z_np["alpha"].shape == (3, 12)
    np.testing.assert_array_equal(z_np["assignments"], R.argmax(-1) + 1)
    with open(out / "dmm_assignments.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["sample", "component"] and [r[0] for r in rows[1:]] == samples
    assert [int(r[1]) for r in rows[1:]] == list(z_np["assignments"])
    with open(out / "dmm_criteria.csv") as f:
        crit = list(csv.DictReader(f))
    assert [int(r["k"]) for r in crit] == [1, 2, 3, 4]
    laplace = [float(r["laplace"]) for r in crit]
    assert int(np.argmin(laplace)) + 1 == 3
    np.testing.assert_allclose(laplace, z_np["criteria_laplace"], rtol=1e-12)
    with open(out / "dmm_alpha.csv") as f:
        alpha_rows = list(csv.reader(f))
    assert [r[0] for r in alpha_rows[1:]] == taxa
    np.testing.assert_allclose(np.array([r[1:] for r in alpha_rows[1:]], dtype=float),
                               z_np["alpha"].T, rtol=1e-9)


def test_cli_plots(tmp_path, capsys):
    """With matplotlib: two PNGs, non-trivial (several colors, real size);
    without it: one clear line and exit status 2."""
    x, _, _ = separated_mixture(B=90, V=8, K=2, seed=int(torch.randint(0, 10**6, ())))
    np.save(tmp_path / "c.npy", x.numpy())
    argv = [str(tmp_path / "c.npy"), "--k", "1-3", "--n-init", "1", "--out",
            str(tmp_path / "r.npz"), "--plot", "--device", "cpu"]
    rc = fit_cli.main(argv)
    cap = capsys.readouterr()
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "need matplotlib" in cap.err and "Traceback" not in cap.err
        return
    assert rc == 0, cap.err
    import matplotlib.image
    for name in ("r_criteria.png", "r_heatmap.png"):
        path = tmp_path / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(str(path))
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 20


def test_cli_user_errors(tmp_path, capsys):
    np.save(tmp_path / "ok.npy", random_table(B=6))
    for argv, msg in ((["--k", "9"], "needs at least 9 samples"),
                      (["--k", "3-x"], "--k must be"),
                      (["--k", "0-2"], ">= 1"),
                      (["--k", "2", "--plot"], "give --out"),
                      (["--k", "2", "--n-init", "0"], "--n-init must be >= 1")):
        assert fit_cli.main([str(tmp_path / "ok.npy")] + argv) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, err


def test_cli_chooses_k_by_the_criterion_it_trusts(tmp_path, capsys):
    """Without a prior the CLI chooses k by BIC (the criterion its advice
    trusts there), with ``--criterion`` naming another."""
    x, _, _ = separated_mixture(B=120, V=10, K=2, seed=int(torch.randint(0, 10**6, ())))
    p = tmp_path / "c.csv"
    np.savetxt(p, x.numpy().astype(int), fmt="%d", delimiter=",")
    for extra in ([], ["--criterion", "laplace"], ["--criterion", "aic"]):
        rc = fit_cli.main([str(p), "--k", "1-4", "--n-init", "1", "--device", "cpu", *extra])
        text = capsys.readouterr().out
        assert rc == 0, text
        found = re.search(r"chosen k by Laplace: (\d+), by BIC: (\d+), by AIC: (\d+)", text)
        by = dict(zip(("laplace", "bic", "aic"), map(int, found.groups())))
        name = extra[1] if extra else "bic"
        label = {"laplace": "Laplace", "bic": "BIC", "aic": "AIC"}[name]
        chosen = int(re.search(rf"chosen k = (\d+) \({label}\)", text).group(1))
        assert chosen == by[name], text
        assert re.search(rf"^{chosen}-component DM mixture", text, re.M), text
    with pytest.raises(SystemExit):
        fit_cli.main([str(p), "--k", "1-2", "--criterion", "waic"])
