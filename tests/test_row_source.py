"""RowSource: counts the fits read a block at a time. A source over an
in-memory matrix that records its reads: the fits equal those of the
matrix itself streamed in the same blocks, and no read is larger than a
block."""
import numpy as np
import pytest
import torch

from dirmult_ext import fit, fit_mixture, fit_regression
from dirmult_ext.data.counts import RowSource

from reference import regression_counts, separated_mixture


class Recorded(RowSource):
    def __init__(self, m, block_rows, sparse=False):
        self.m, self.shape, self.sparse = m, tuple(m.shape), sparse
        self._block = block_rows
        self.reads = []

    @property
    def block_rows(self):
        return self._block

    def read(self, start, stop):
        self.reads.append(stop - start)
        return self.m[start:stop]


@pytest.mark.parametrize("sparse", [False, True])
def test_fits_read_blocks(sparse):
    x, _, _ = separated_mixture(B=200)
    m = x.numpy()
    if sparse:
        sp = pytest.importorskip("scipy.sparse", reason="sparse rows as scipy CSR")
        m = sp.csr_matrix(m)
    src = Recorded(m, 30, sparse)
    a = fit(src, tol=1e-10)
    b = fit(m, tol=1e-10, batch_size=30)
    torch.testing.assert_close(a.alpha, b.alpha, rtol=1e-12, atol=0)
    seed = int(np.random.default_rng().integers(2 ** 31))
    ma = fit_mixture(src, 3, n_init=1, n_screen=3, seed=seed)
    mb = fit_mixture(m, 3, n_init=1, n_screen=3, seed=seed, batch_size=30)
    torch.testing.assert_close(ma.responsibilities, mb.responsibilities, rtol=1e-10, atol=1e-12)
    assert ma.log_lik == pytest.approx(mb.log_lik, rel=1e-12)
    assert max(src.reads) == 30 and sum(src.reads) >= 10 * 200


def test_regression_reads_blocks():
    W = torch.randn(2, 5, dtype=torch.float64) * 0.5
    counts, X = regression_counts(150, W, torch.ones(5, dtype=torch.float64))
    src = Recorded(counts.numpy(), 40)
    a = fit_regression(src, X)
    b = fit_regression(counts, X, batch_size=40)
    torch.testing.assert_close(a.W, b.W, rtol=1e-8, atol=1e-10)
    assert max(src.reads) == 40


def test_row_source_errors():
    src = Recorded(np.ones((10, 1), dtype=np.float32), 4)
    with pytest.raises(ValueError, match="at least 2 categories"):
        fit(src)

    class Wrong(Recorded):
        def read(self, start, stop):
            return self.m[start:stop + 1]

    with pytest.raises(ValueError, match=r"read\(0, 4\) returned shape \(5, 3\)"):
        fit(Wrong(np.ones((10, 3), dtype=np.float32), 4))
    with pytest.raises(TypeError, match="read a block at a time"):
        Recorded(np.ones((10, 3)), 4).to("cpu")
