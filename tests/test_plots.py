"""The figures of plots.py and `dirmult-ext fit --plot`: each is written and
is a real, non-empty PNG."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib.image  # noqa: E402

from dirmult_ext.cli import fit as fit_cli  # noqa: E402
from dirmult_ext import fit  # noqa: E402
from dirmult_ext.models.mixture import fit_mixture  # noqa: E402
from dirmult_ext.integrations.plots import plot_component_heatmap, plot_criteria  # noqa: E402

from reference import separated_mixture  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_colors=5):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, img.shape
    assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) >= min_colors


@pytest.fixture(scope="module")
def data():
    x, _, _ = separated_mixture(B=90, V=8, K=2, seed=3)
    return x


def test_each_figure_is_a_png(tmp_path, data):
    sel = fit_mixture(data, range(1, 4), n_init=1, n_screen=0, seed=0)
    names = [f"f{v}" for v in range(data.shape[1])]
    got = [plot_criteria(sel, str(tmp_path / "criteria.png")),
           plot_component_heatmap(sel.best, names, str(tmp_path / "heatmap.png"), n=5),
           plot_component_heatmap(fit(data), names, str(tmp_path / "one.png"))]
    assert got == [str(tmp_path / n) for n in ("criteria.png", "heatmap.png", "one.png")]
    for n in ("criteria.png", "heatmap.png", "one.png"):
        assert_png(tmp_path / n)


@pytest.mark.parametrize("k,figures", [("1", ["r_heatmap.png"]),
                                       ("2", ["r_heatmap.png"]),
                                       ("1-3", ["r_criteria.png", "r_heatmap.png"])])
def test_cli_plot(tmp_path, capsys, data, k, figures):
    np.save(tmp_path / "c.npy", data.numpy())
    rc = fit_cli.main([str(tmp_path / "c.npy"), "--k", k, "--n-init", "1", "--n-screen", "0",
                       "--out", str(tmp_path / "r.npz"), "--plot", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0, out
    written = sorted(p.name for p in tmp_path.glob("*.png"))
    assert written == figures, written
    for name in figures:
        assert name in out
        assert_png(tmp_path / name)
