"""What a new user hits first: R's write.csv tables, orientation errors that
say how to set it, fractional counts, and the advice after a table of
criteria."""
import numpy as np
import pytest

from dirmult_ext.cli.advice import criteria_advice
from dirmult_ext.cli.main import main
from dirmult_ext.data.io import load_count_table


def write_r_csv(path, counts, row_names, col_names):
    """As R's write.csv(df) writes a data frame with row names: every string
    quoted, the header's first cell "", numbers bare, LF line ends."""
    with open(path, "w", newline="") as f:
        f.write(",".join(['""'] + [f'"{c}"' for c in col_names]) + "\n")
        for name, row in zip(row_names, counts):
            f.write(",".join([f'"{name}"'] + [str(int(v)) for v in row]) + "\n")


def taxa_by_samples(n_taxa=7, n_samples=11):
    rng = np.random.default_rng()
    x = rng.integers(0, 30, size=(n_taxa, n_samples))
    x[0] += 1                                          # no empty sample
    return x


def test_r_write_csv_taxa_by_samples_is_transposed(tmp_path):
    x = taxa_by_samples()
    taxa = [f"OTU_{i + 1}" for i in range(x.shape[0])]
    samples = [f"S{j + 1}" for j in range(x.shape[1])]
    p = tmp_path / "otu.csv"
    write_r_csv(p, x, taxa, samples)
    t = load_count_table(p)
    assert t.transposed and t.sample_names == samples and t.feature_names == taxa
    np.testing.assert_array_equal(t.counts.numpy(), x.T)
    # samples x taxa from R (rows S1.., columns named as taxa): kept
    q = tmp_path / "seqtab.csv"
    seqs = ["".join(np.random.default_rng(i).choice(list("ACGT"), 30)) for i in range(7)]
    write_r_csv(q, x.T, samples, seqs)
    t2 = load_count_table(q)
    assert not t2.transposed and t2.counts.shape == (11, 7)


def test_ambiguous_r_table_warns_and_regress_says_how_to_flip(tmp_path, capsys):
    x = taxa_by_samples()
    genera = ["Bacteroides", "Prevotella", "Faecalibacterium", "Roseburia", "Blautia",
              "Dorea", "Alistipes"]
    people = ["anna", "ben", "carla", "dan", "eva", "finn", "gus", "hana", "ivo", "jon", "kim"]
    p = tmp_path / "taxa.csv"
    write_r_csv(p, x, genera, people)
    with pytest.warns(UserWarning, match="--samples-in-columns"):
        t = load_count_table(p)
    assert not t.transposed
    cov = tmp_path / "covariates.csv"
    with open(cov, "w") as f:
        f.write('"","age"\n' + "".join(f'"{s}",{20 + i}\n' for i, s in enumerate(people)))
    with pytest.warns(UserWarning):
        rc = main(["regress", str(p), str(cov), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "have no row in" in err and "--samples-in-columns" in err
    assert "columns are named like" in err
    rc = main(["regress", str(p), str(cov), "--device", "cpu", "--samples-in-columns",
               "--max-iter", "50"])
    assert rc == 0, capsys.readouterr().err


def test_fractional_counts_are_an_error_unless_allowed(tmp_path, capsys):
    rng = np.random.default_rng()
    x = rng.integers(1, 20, size=(12, 4)).astype(float)
    i, j = int(rng.integers(0, 12)), int(rng.integers(0, 4))
    x[i, j] += 0.5
    p = tmp_path / "frac.csv"
    np.savetxt(p, x, fmt="%g", delimiter=",")
    rc = main(["fit", str(p), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(p) in err and f"{x[i, j]:g}" in err and f"line {i + 1}" in err
    assert "--allow-fractional" in err and err.count("\n") == 1
    rc = main(["fit", str(p), "--device", "cpu", "--allow-fractional"])
    assert rc == 0, capsys.readouterr().err


def test_criteria_advice():
    ks = [1, 2, 3, 4, 5]
    agree = criteria_advice({"laplace": 3, "bic": 3, "aic": 3}, ks, prior=False)
    assert agree == ["Laplace, BIC and AIC all choose k = 3"]
    # structureless data without a prior: Laplace at the top, BIC/AIC at 1
    flat = criteria_advice({"laplace": 5, "bic": 1, "aic": 1}, ks, prior=False)
    # which to trust, then why: two lines
    assert "trust BIC (k = 1)" in flat[0] and len(flat) == 2
    assert flat[1].startswith("why: without a prior") and "--prior dmn" in flat[1]
    # with the prior, Laplace is the one to use; at the top: widen the range
    prior = criteria_advice({"laplace": 5, "bic": 4, "aic": 5}, ks, prior=True)
    assert "trust Laplace (k = 5)" in prior[0]
    assert "Laplace approximates the marginal likelihood" in prior[1]
    assert "largest fitted" in prior[2] and "--k 5-9" in prior[2]
    inside = criteria_advice({"laplace": 3, "bic": 2, "aic": 3}, ks, prior=True)
    assert len(inside) == 2                     # interior: no range advice
    low = criteria_advice({"laplace": 3, "bic": 3, "aic": 3}, [3, 4, 5], prior=True)
    assert "smallest fitted" in low[1] and "--k 1-3" in low[1]
    top = criteria_advice({"laplace": 5, "bic": 5, "aic": 5}, [4, 5], prior=False)
    assert len(top) == 1                        # two k: no range advice
