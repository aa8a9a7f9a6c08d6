"""Row streaming (dirmult_ext.row_stream): the blocks, the staged path (pinned
and overlapped on CUDA; run without pinning on the CPU), the automatic batch
size, and fits over streamed rows against fits over the whole matrix."""
import functools
import math
import sys
import warnings

import pytest
import torch

import dirmult_ext
from dirmult_ext import SparseCounts
from dirmult_ext.cli import fit as fit_cli
from dirmult_ext.data import row_stream
from dirmult_ext import fit
from dirmult_ext.models.mixture import fit_mixture
from dirmult_ext.data.row_stream import auto_batch_size, batch_bounds, matrix_bytes, stream_rows

from reference import separated_mixture

from dirmult_ext.models import engine as fit_module

CUDA = torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA and the package's CUDA kernels")

# Streamed and whole-matrix fits differ only in the order of float64 sums over
# the rows (batch by batch, then across batches): one DM's log-likelihood to
# 1e-11 relative and its alpha to 1e-8; a mixture, whose EM amplifies the
# rounding a little more, to 1e-9 and 1e-6.
FIT_LL_RTOL, FIT_ALPHA_RTOL = 1e-11, 1e-8
MIX_LL_RTOL, MIX_ALPHA_ATOL = 1e-9, 1e-6


def _counts(B, V, gen, sparse):
    """Random counts, about half zeros, a few empty rows; never all zero."""
    x = torch.poisson(torch.rand(B, V, generator=gen) * 3, generator=gen)
    x = x * (torch.rand(B, V, generator=gen) < 0.5)
    if B > 4:
        x[torch.randint(0, B, (2,), generator=gen)] = 0
    x[0, 0] += 1
    if not sparse:
        return x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return x, SparseCounts.from_dense(x)


def _dense(block):
    return block.to_dense() if isinstance(block, SparseCounts) else block


@pytest.fixture
def staged_in_fit(monkeypatch):
    """The fit's batches through the staged path, also on the CPU."""
    monkeypatch.setattr(fit_module, "stream_rows",
                        functools.partial(stream_rows, staged=True))


@pytest.fixture
def stagings(monkeypatch):
    """The staging objects stream_rows makes, recorded."""
    made = []

    class Recorded(row_stream._Staging):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(row_stream, "_Staging", Recorded)
    return made


# ----------------------------------------------------------------- the blocks
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("staged", [False, True])
def test_blocks_cover_rows_in_order(sparse, staged):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    B, V = 203, 9
    x, counts = _counts(B, V, gen, True) if sparse else (_counts(B, V, gen, False),) * 2
    for bs in (1, 7, 50, B - 1, B, B + 5):
        blocks = list(stream_rows(counts, "cpu", bs, staged=staged))
        bounds = [(s, e) for s, e, _ in blocks]
        assert bounds == batch_bounds(B, bs)
        assert bounds[0][0] == 0 and bounds[-1][1] == B
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert bounds[-1][1] - bounds[-1][0] == (B % bs or min(bs, B))   # the partial block
        for s, e, block in blocks:
            assert block.shape == (e - s, V)
            if sparse:   # CSR parts of the rows alone: offsets from 0 to the block's nnz
                assert int(block.crow_indices[0]) == 0
                assert int(block.crow_indices[-1]) == block.nnz == int(
                    counts.crow_indices[e] - counts.crow_indices[s])
        # (the blocks are all held until now: the reused staging buffers must
        # not have overwritten earlier ones)
        assert torch.equal(torch.cat([_dense(b) for _, _, b in blocks]), x)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("staged", [False, True])
def test_no_rows_no_blocks(sparse, staged):
    x = torch.zeros(0, 5)
    counts = SparseCounts.from_dense(x) if sparse else x
    assert list(stream_rows(counts, "cpu", 4, staged=staged)) == []
    assert batch_bounds(0, 4) == []
    with pytest.raises(ValueError, match="batch_size"):
        batch_bounds(3, 0)


def test_staging_buffers_two_sets_sized_to_the_largest_block(stagings):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x, sc = _counts(101, 13, gen, True)
    list(stream_rows(sc, "cpu", 20, staged=True))
    (st,) = stagings
    crow = sc.crow_indices
    most = max(int(crow[e] - crow[s]) for s, e in batch_bounds(101, 20))
    assert len(st.buffers) == 2
    for crow_buf, col_buf, val_buf in st.buffers:
        assert crow_buf.numel() == 21 and col_buf.numel() == val_buf.numel() == most
    list(stream_rows(x, "cpu", 200, staged=True))       # one block: one set
    assert len(stagings[1].buffers) == 1 and stagings[1].buffers[0][0].numel() == 101 * 13


def test_abandoned_stream_stops_its_worker():
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = _counts(60, 4, gen, False)
    it = stream_rows(x, "cpu", 10, staged=True)
    s, e, first = next(it)
    it.close()                                          # (joins the pending load)
    assert (s, e) == (0, 10) and torch.equal(first, x[:10])


# ---------------------------------------------------------- automatic policy
def test_auto_batch_size_rule():
    GB = 1 << 30
    assert auto_batch_size(4 * GB, 10 ** 6, 8 * GB) is None        # half the free memory
    assert auto_batch_size(3 * GB, 10 ** 6, 80 * GB) is None
    bs = auto_batch_size(10 * GB, 10 ** 6, 8 * GB)
    assert bs == 50_000              # a block of average rows: 1/16 of the free memory
    assert auto_batch_size(10 * GB + 1, 10 ** 6, 8 * GB) == 49_999
    assert auto_batch_size(10 ** 6 * GB, 10, GB) == 1                # at least one row
    assert auto_batch_size(5 * GB, 0, GB) is None
    assert auto_batch_size(3 * GB, 100, 4 * GB, fraction=0.25, share=0.5) == 66


def test_matrix_bytes():
    x = torch.zeros(7, 5, dtype=torch.float64)
    x[1, 2] = x[3, 4] = x[6, 0] = 2
    assert matrix_bytes(x) == 7 * 5 * 8
    sc = SparseCounts.from_dense(x.float())
    assert matrix_bytes(sc) == (8 * sc.crow_indices.element_size()
                                + 3 * sc.col_indices.element_size() + 3 * 4)


def test_rows_stream_unasked_when_the_device_is_short(monkeypatch):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = _counts(1000, 10, gen, False)                   # 40000 bytes
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40_000, 10 ** 9))
    assert fit_module._auto_batch_size(x, cuda) == auto_batch_size(40_000, 1000, 40_000) == 62
    assert fit_module._auto_batch_size(x, torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80_000, 10 ** 9))
    assert fit_module._auto_batch_size(x, cuda) is None


# ------------------------------------------------------- fits over the stream
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("staged", [False, True])
def test_fit_streamed_equals_whole(sparse, staged, monkeypatch, stagings):
    if staged:
        monkeypatch.setattr(fit_module, "stream_rows", functools.partial(stream_rows, staged=True))
    alpha = torch.rand(11, dtype=torch.float64) + 0.2
    x = dirmult_ext.DirichletMultinomial(torch.randint(10, 80, (517,)), alpha).sample().float()
    counts = SparseCounts.from_dense(x) if sparse else x
    whole = fit(counts)
    streamed = fit(counts, batch_size=64)
    assert bool(stagings) == staged                      # (the path under test was taken)
    assert streamed.n_iter == whole.n_iter and streamed.converged
    assert math.isclose(whole.log_lik, streamed.log_lik, rel_tol=FIT_LL_RTOL)
    torch.testing.assert_close(streamed.alpha, whole.alpha, rtol=FIT_ALPHA_RTOL, atol=0)


@pytest.mark.parametrize("sparse", [False, True])
def test_fit_mixture_streamed_equals_whole(sparse, staged_in_fit):
    x, _, _ = separated_mixture(B=301)
    counts = SparseCounts.from_dense(x) if sparse else x
    kw = dict(n_init=1, n_screen=3, screen_iter=3, seed=int(torch.randint(0, 1000, (1,))))
    whole = fit_mixture(counts, 3, **kw)
    streamed = fit_mixture(counts, 3, batch_size=40, **kw)
    assert streamed.n_iter == whole.n_iter
    assert math.isclose(whole.log_lik, streamed.log_lik, rel_tol=MIX_LL_RTOL)
    torch.testing.assert_close(streamed.log_alpha, whole.log_alpha, rtol=0,
                               atol=MIX_ALPHA_ATOL)
    torch.testing.assert_close(streamed.responsibilities, whole.responsibilities, rtol=0,
                               atol=1e-6)


def test_cli_streams_a_sparse_file_without_densifying(tmp_path, monkeypatch, capsys):
    import scipy.sparse
    x, _, _ = separated_mixture(B=240)
    path = tmp_path / "m.npz"
    scipy.sparse.save_npz(path, scipy.sparse.csr_matrix(x.numpy()))
    seen = []

    def no_dense(self):
        raise AssertionError("the sparse counts were densified")

    real = dirmult_ext.models.mixture.fit_mixture

    def recording(counts, *a, **k):
        seen.append((type(counts), counts.device, k["batch_size"]))
        return real(counts, *a, **k)

    monkeypatch.setattr(SparseCounts, "to_dense", no_dense)
    monkeypatch.setattr(dirmult_ext.models.mixture, "fit_mixture", recording)
    rc = fit_cli.main([str(path), "--k", "3", "--batch-size", "50", "--n-init", "1",
                       "--n-screen", "0", "--progress", "--device", "cpu"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert seen == [(SparseCounts, torch.device("cpu"), 50)]
    assert "3-component DM mixture" in out.out
    assert "fit_mixture" in out.err and ("it/s" in out.err or "s/it" in out.err)   # the bar


# ------------------------------------------------------------------- CUDA
@needs_cuda
@pytest.mark.parametrize("sparse", [False, True])
def test_cuda_pinned_stream_equals_whole(sparse, stagings):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x, counts = _counts(1003, 37, gen, True) if sparse else (_counts(1003, 37, gen, False),) * 2
    blocks = list(stream_rows(counts, "cuda", 128))
    torch.cuda.synchronize()
    assert stagings and all(b.is_pinned() for st in stagings for bufs in st.buffers
                            for b in bufs)
    assert all(block.device.type == "cuda" for _, _, block in blocks)
    assert torch.equal(torch.cat([_dense(b) for _, _, b in blocks]).cpu(), x)
    alpha = torch.rand(37, dtype=torch.float64) + 0.3
    y = dirmult_ext.DirichletMultinomial(torch.randint(10, 80, (2001,)), alpha).sample().float()
    ys = SparseCounts.from_dense(y) if sparse else y
    whole = fit(ys, device="cuda")
    streamed = fit(ys, device="cuda", batch_size=300)
    assert math.isclose(whole.log_lik, streamed.log_lik, rel_tol=FIT_LL_RTOL)
    torch.testing.assert_close(streamed.alpha, whole.alpha, rtol=FIT_ALPHA_RTOL, atol=0)
    m, _, _ = separated_mixture(B=601)
    ms = SparseCounts.from_dense(m) if sparse else m
    kw = dict(n_init=1, n_screen=0, seed=5, device="cuda")
    a, b = fit_mixture(ms, 3, **kw), fit_mixture(ms, 3, batch_size=100, **kw)
    assert math.isclose(a.log_lik, b.log_lik, rel_tol=MIX_LL_RTOL)
    torch.testing.assert_close(b.log_alpha, a.log_alpha, rtol=0, atol=MIX_ALPHA_ATOL)


@needs_cuda
@pytest.mark.parametrize("sparse", [False, True])
def test_cuda_stream_from_pinned_matrix_skips_staging(sparse, stagings):
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x, counts = _counts(1003, 37, gen, True) if sparse else (_counts(1003, 37, gen, False),) * 2
    if sparse:
        pinned = SparseCounts(counts.crow_indices.pin_memory(), counts.col_indices.pin_memory(),
                              counts.values.pin_memory(), counts.shape, validate=False)
    else:
        pinned = counts.pin_memory()
    staged_parts = []
    real_copy = torch.Tensor.copy_

    def spy(self, src, *args, **kwargs):   # the staging copies into the pinned buffers
        if self.is_pinned() and self.device.type == "cpu":
            staged_parts.append(src.numel())
        return real_copy(self, src, *args, **kwargs)

    torch.Tensor.copy_ = spy
    try:
        blocks = list(stream_rows(pinned, "cuda", 128))
        torch.cuda.synchronize()
    finally:
        torch.Tensor.copy_ = real_copy
    assert torch.equal(torch.cat([_dense(b) for _, _, b in blocks]).cpu(), x)
    # Only the rebased row offsets of a sparse block are made anew (and staged).
    n_blocks = len(blocks)
    assert staged_parts == ([129] * (n_blocks - 1) + [1003 - 128 * (n_blocks - 1) + 1]
                            if sparse else [])


@needs_cuda
def test_cuda_streams_unasked_when_short_of_memory(monkeypatch, stagings):
    alpha = torch.rand(20, dtype=torch.float64) + 0.3
    x = dirmult_ext.DirichletMultinomial(torch.randint(10, 80, (3000,)), alpha).sample().float()
    whole = fit(x, device="cuda")
    free = matrix_bytes(x)           # the matrix takes all of the (pretended) free memory
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    streamed = fit(x, device="cuda")
    assert stagings and stagings[0].stream is not None
    assert math.isclose(whole.log_lik, streamed.log_lik, rel_tol=FIT_LL_RTOL)
    torch.testing.assert_close(streamed.alpha, whole.alpha, rtol=FIT_ALPHA_RTOL, atol=0)


BIGFIT = __import__("pathlib").Path(__file__).resolve().parents[1] / "scripts/gpu/big_sparse_fit.py"


@pytest.mark.slow  # (processes of their own: runs in CI, `-m slow`)
@pytest.mark.skipif(not BIGFIT.exists(), reason="run from a source checkout")
def test_big_sparse_fit_script_tiny_on_cpu(tmp_path):
    import json
    import os
    import subprocess
    env = dict(os.environ, OUT=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BIGFIT), "--rows", "1500", "--cols", "200",
                           "--k", "2", "--max-iter", "3", "--batch-size", "400",
                           "--device", "cpu"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("bigfit ")]
    assert len(lines) == 3 and "write" in lines[0] and "streamed" in lines[2]
    out = json.loads((tmp_path / "bigfit.json").read_text())
    assert out["rows"] == 1500 and out["nnz"] > 0
    on_device, streamed = out["runs"]
    assert streamed["batch_size"] == 400 and on_device["batch_size"] is None
    for r in out["runs"]:
        assert r["rc"] == 0 and r["counts_type"] == "SparseCounts"
        assert r["shape"] == [1500, 200] and r["n_iter"] == 3 and r["iter_s"] > 0
        assert r["csr_bytes"] == 1501 * 4 + out["nnz"] * 8         # int32 indices, float32
        assert r["peak_rss"] >= r["base_rss"] > 0
    # the same fit either way (float64 rounding of the batch sums apart)
    assert math.isclose(on_device["log_lik"], streamed["log_lik"], rel_tol=MIX_LL_RTOL)
