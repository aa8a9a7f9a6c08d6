"""Property-based tests of the ops' arguments (hypothesis draws and
shrinks them): for any shape, dtype, layout of shared, per-sample or
per-component concentrations, any finite log_alpha of the dtype (the
extremes included) and any valid counts, the value and the gradient are
finite and match mpmath; an invalid argument is a ValueError naming it."""
import math

import pytest
import torch

# (a test requirement, pyproject's test extra; the GPU machine may lack it)
pytest.importorskip("hypothesis", reason="needs hypothesis (pip install hypothesis)")
from hypothesis import HealthCheck, assume, given, settings, strategies as st  # noqa: E402

import dirmult_ext as dm  # noqa: E402
from test_extreme_log_alpha import mp_row  # noqa: E402

# Finite log_alpha across the dtype's whole useful range: beyond exp's range
# on both sides, and moderate values.
LOG_ALPHA = {torch.float32: st.floats(-300.0, 300.0, width=32),
             torch.float64: st.floats(-1000.0, 1000.0)}
TOL = {torch.float32: 4e-6, torch.float64: 1e-12}
# (device, the fixture, is a torch.device: nothing to reset between examples.)
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@st.composite
def problems(draw):
    """(counts (B, V) float64, log_alpha (V,) or (B, V) float64, dtype,
    transposed layout)."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    B = draw(st.integers(1, 4))
    V = draw(st.integers(1, 6))
    counts = draw(st.lists(st.lists(st.integers(0, 40), min_size=V, max_size=V),
                           min_size=B, max_size=B))
    per_sample = draw(st.booleans())
    shape = (B, V) if per_sample else (V,)
    la = draw(st.lists(LOG_ALPHA[dtype], min_size=math.prod(shape), max_size=math.prod(shape)))
    return (torch.tensor(counts, dtype=torch.float64),
            torch.tensor(la, dtype=torch.float64).reshape(shape), dtype, draw(st.booleans()))


@SETTINGS
@given(problems())
def test_log_lik_finite_and_accurate(device, problem):
    counts, la, dtype, transposed = problem
    x = counts.to(device=device, dtype=dtype)
    if transposed:  # the same elements in column-major memory
        x = x.t().contiguous().t()
    la_d = la.to(device=device, dtype=dtype).requires_grad_()
    out = dm.log_lik(x, la_d)
    (g,) = torch.autograd.grad(out.sum(), la_d)
    out, g = out.detach().double().cpu(), g.double().cpu()
    assert torch.isfinite(out).all() and torch.isfinite(g).all(), (out, g)
    la32 = la.to(dtype).double()  # the values the op saw
    gref = torch.zeros_like(la)
    gmag = torch.zeros_like(la)
    for b in range(counts.shape[0]):
        row_la = la32 if la.dim() == 1 else la32[b]
        v, gr, mag, gm = mp_row(counts[b].tolist(), row_la.tolist())
        # (+ N: alpha in the dtype is exp(log_alpha) rounded, worth up to n
        # ulps in each count's term, which mag misses where the terms are tiny)
        N = float(counts[b].sum())
        assert abs(float(out[b]) - v) <= TOL[dtype] * (mag + N), (b, float(out[b]), v)
        if la.dim() == 1:
            gref += torch.tensor(gr, dtype=torch.float64)
            gmag += torch.tensor(gm, dtype=torch.float64)
        else:
            gref[b] = torch.tensor(gr, dtype=torch.float64)
            gmag[b] = torch.tensor(gm, dtype=torch.float64)
    assert ((g - gref).abs() <= 4 * TOL[dtype] * gmag).all(), (g, gref)


@SETTINGS
@given(K=st.integers(1, 3), V=st.integers(1, 5), B=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float64]), data=st.data())
def test_components_and_csr_match_the_rows(device, K, V, B, dtype, data):
    """log_lik_components (dense and CSR) column k equals log_lik with
    component k, for extreme log_alpha too."""
    la = torch.tensor(data.draw(st.lists(LOG_ALPHA[dtype], min_size=K * V, max_size=K * V)),
                      dtype=dtype).reshape(K, V).to(device)
    counts = torch.tensor(data.draw(st.lists(st.integers(0, 30), min_size=B * V,
                                             max_size=B * V)), dtype=dtype).reshape(B, V)
    counts = counts.to(device)
    comp = dm.log_lik_components(counts, la).double().cpu()
    sparse = dm.log_lik_components(counts.to_sparse_csr(), la).double().cpu()
    rows = torch.stack([dm.log_lik(counts, la[k]) for k in range(K)], -1).double().cpu()
    assert torch.isfinite(comp).all()
    scale = 1 + rows.abs() + counts.sum(-1, keepdim=True).double().cpu() * la.abs().max().cpu()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert ((comp - rows).abs() <= tol * scale).all()
    assert ((sparse - rows).abs() <= tol * scale).all()


BAD_LOG_ALPHA = st.sampled_from([math.nan, math.inf, -math.inf])
BAD_COUNT = st.sampled_from([-1.0, -0.5, math.nan, math.inf])


@SETTINGS
@given(V=st.integers(2, 6), bad=BAD_LOG_ALPHA, at=st.integers(0, 5))
def test_validate_names_log_alpha(device, V, bad, at):
    la = torch.randn(V, device=device)
    la[at % V] = bad
    with pytest.raises(ValueError, match="log_alpha contains NaN or infinite"):
        dm.log_lik(torch.ones(2, V, device=device), la, validate=True)


@SETTINGS
@given(V=st.integers(2, 6), bad=BAD_COUNT, at=st.integers(0, 11))
def test_validate_names_counts(device, V, bad, at):
    counts = torch.ones(2, V, device=device)
    counts.view(-1)[at % (2 * V)] = bad
    with pytest.raises(ValueError, match="counts contains"):
        dm.log_lik(counts, torch.zeros(V, device=device), validate=True)


@SETTINGS
@given(V=st.integers(1, 6), W=st.integers(1, 6), per_sample=st.booleans())
def test_shape_mismatch_names_the_shapes(device, V, W, per_sample):
    assume(V != W)
    la = torch.zeros((3, W) if per_sample else (W,), device=device)
    with pytest.raises(ValueError, match="log_alpha must have shape"):
        dm.log_lik(torch.ones(3, V, device=device), la)
