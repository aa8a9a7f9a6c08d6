"""``dirmult-ext regress``: files in, the coefficient table out; samples
matched by name or by order; user errors."""
import csv

import numpy as np
import pytest
import torch

from dirmult_ext import cli, fit_regression
from dirmult_ext.data.io import load_covariates

from reference import regression_counts as simulate


def _data(B=150):
    W = torch.tensor([[0.7, -0.5, 0.1, 0.0], [0.0, 0.3, -0.6, 0.2]], dtype=torch.float64)
    b = torch.tensor([0.2, 0.0, -0.1, 0.3], dtype=torch.float64)
    counts, X = simulate(B, W, b)
    return counts.numpy().astype(np.int64), X.numpy()


def _write_counts(path, counts, names=True, taxa_in_rows=False):
    B, V = counts.shape
    with open(path, "w") as f:
        if taxa_in_rows:
            f.write("Taxon," + ",".join(f"s{i}" for i in range(B)) + "\n")
            for v in range(V):
                f.write(f"tax{v}," + ",".join(str(c) for c in counts[:, v]) + "\n")
            return
        if names:
            f.write("sample," + ",".join(f"tax{v}" for v in range(V)) + "\n")
        for i in range(B):
            f.write((f"s{i}," if names else "") + ",".join(str(c) for c in counts[i]) + "\n")


def _write_covariates(path, X, order, names=True, sep=","):
    with open(path, "w") as f:
        f.write(sep.join((["id"] if names else []) + ["age", "ph"]) + "\n")
        for i in order:
            f.write(sep.join(([f"s{i}"] if names else []) + [repr(float(x)) for x in X[i]])
                    + "\n")


def _read_table(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_end_to_end_by_name(tmp_path, capsys):
    counts, X = _data()
    order = np.random.permutation(len(X))
    _write_counts(tmp_path / "c.csv", counts)
    _write_covariates(tmp_path / "x.tsv", X, order, sep="\t")
    out = tmp_path / "coef.csv"
    rc = cli.main(["regress", str(tmp_path / "c.csv"), str(tmp_path / "x.tsv"), "--device",
                   "cpu", "--top", "4", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "matched by name" in text and "likelihood ratio" in text
    ref = fit_regression(torch.from_numpy(counts).float(), torch.from_numpy(X),
                         covariate_names=["age", "ph"],
                         category_names=[f"tax{v}" for v in range(4)])
    rows = _read_table(out)
    assert len(rows) == 12 and list(rows[0]) == ["covariate", "category", "estimate", "se",
                                                 "z", "p"]
    ps = [float(r["p"]) for r in rows]
    assert ps == sorted(ps)
    for r in rows:
        if r["covariate"] == "(intercept)":
            continue
        p = ["age", "ph"].index(r["covariate"])
        v = int(r["category"][3:])
        assert abs(float(r["estimate"]) - float(ref.W[p, v])) < 1e-9
        assert abs(float(r["se"]) - float(ref.se_W[p, v])) < 1e-9
    # the printed table: the top 4 covariate coefficients, most significant first
    best = ref.to_table(include_intercept=False)[0]
    lines = [ln for ln in text.splitlines() if ln.strip().startswith(("age", "ph"))]
    assert len(lines) == 4
    assert lines[0].split()[:2] == [best["covariate"], best["category"]]


def test_by_order_taxa_in_rows_and_penalties(tmp_path, capsys):
    counts, X = _data(120)
    _write_counts(tmp_path / "taxa.csv", counts, taxa_in_rows=True)
    np.save(tmp_path / "x.npy", X)
    rc = cli.main(["regress", str(tmp_path / "taxa.csv"), str(tmp_path / "x.npy"), "--device",
                   "cpu", "--penalty", "group-lasso", "--lam", "1e6", "--out",
                   str(tmp_path / "gl.csv")])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "transposed" in text and "by order" in text
    rows = _read_table(tmp_path / "gl.csv")
    assert all(float(r["estimate"]) == 0.0 for r in rows if r["covariate"] != "(intercept)")
    # no names in either file: by order; --no-bias
    _write_counts(tmp_path / "plain.csv", counts, names=False)
    _write_covariates(tmp_path / "plain_x.csv", X, range(len(X)), names=False)
    rc = cli.main(["regress", str(tmp_path / "plain.csv"), str(tmp_path / "plain_x.csv"),
                   "--no-bias", "--penalty", "l2", "--lam", "1", "--out",
                   str(tmp_path / "nb.csv")])
    assert rc == 0
    rows = _read_table(tmp_path / "nb.csv")
    assert len(rows) == 8 and {r["covariate"] for r in rows} == {"age", "ph"}


def test_user_errors(tmp_path, capsys):
    counts, X = _data(60)
    _write_counts(tmp_path / "c.csv", counts)
    # a sample without covariates
    _write_covariates(tmp_path / "x.csv", X, range(1, 60))
    assert cli.main(["regress", str(tmp_path / "c.csv"), str(tmp_path / "x.csv")]) == 2
    assert "1 of the 60 samples of the counts have no row" in capsys.readouterr().err
    # by order, the numbers of rows differ
    _write_covariates(tmp_path / "xo.csv", X[:50], range(50), names=False)
    assert cli.main(["regress", str(tmp_path / "c.csv"), str(tmp_path / "xo.csv")]) == 2
    assert "matched by order" in capsys.readouterr().err
    # a categorical covariate
    with open(tmp_path / "cat.csv", "w") as f:
        f.write("id,age,site\n")
        for i in range(60):
            f.write(f"s{i},{X[i, 0]},{'ab'[i % 2]}\n")
    assert cli.main(["regress", str(tmp_path / "c.csv"), str(tmp_path / "cat.csv")]) == 2
    err = capsys.readouterr().err
    assert "covariates" in err and "numeric" in err and "'a'" in err
    # NaN covariate
    Xn = X.copy()
    Xn[5, 1] = np.nan
    _write_covariates(tmp_path / "nan.csv", Xn, range(60))
    assert cli.main(["regress", str(tmp_path / "c.csv"), str(tmp_path / "nan.csv")]) == 2
    assert "X must be finite" in capsys.readouterr().err
    # options
    _write_covariates(tmp_path / "ok.csv", X, range(60))
    assert cli.main(["regress", str(tmp_path / "c.csv"), str(tmp_path / "ok.csv"),
                     "--lam", "3"]) == 2
    assert "--lam needs --penalty" in capsys.readouterr().err
    assert cli.main(["regress", str(tmp_path / "nope.csv"), str(tmp_path / "ok.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        load_covariates(tmp_path / "missing.csv")
