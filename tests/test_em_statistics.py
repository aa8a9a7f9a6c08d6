"""The fitting engine's sufficient statistics from the weighted (column,
count) histograms (``engine.row_stats``) against an independent float64
route: the gradient by autograd through the components' backward op, the
trigamma and digamma sums per nonzero and per row with scipy's special
functions (torch's float64 CPU trigamma is off by up to 6e-10 relative for
arguments near 1-10; scipy's Hurwitz zeta is not). Then whole mixture fits with the engine's statistics against the
same fits with the independent route's statistics."""
import math

import pytest
import torch
from torch import Tensor

from dirmult_ext.data.sparse_counts import SparseCounts
from dirmult_ext.likelihood.log_lik import log_lik, log_lik_components
from dirmult_ext.models import engine, mixture
from dirmult_ext.models.criteria import GammaPrior
from dirmult_ext.models.mixture import fit_mixture

from reference import random_sparse_counts

# Float64 statistics summed in other orders: relative to the size of the
# terms summed.
REL = 1e-11


def oracle_row_stats(rows, eta, comps, hessian, reduce=engine.identity, reweight=None):
    """The statistics term by term: G = d/d log_alpha of sum_b w_b ll_b
    (autograd: the backward op reads the counts), Q, Z, D from torch's
    special functions over every nonzero and row in float64."""
    special = pytest.importorskip("scipy.special", reason="the reference's special functions")

    def psi(x):
        return torch.from_numpy(special.digamma(x.numpy()))

    def psi1(x):
        return torch.from_numpy(special.polygamma(1, x.numpy()))

    k, V = eta.shape
    eta = eta.detach()
    alpha = eta.exp()
    A = alpha.sum(-1)
    L = torch.zeros(k, dtype=torch.float64, device=eta.device)
    G = torch.zeros(k, V, dtype=torch.float64, device=eta.device)
    D, Q, Z = L.clone(), G.clone(), L.clone()
    for bi, (cb, wb, Nb) in enumerate(rows.batches(comps)):
        e = eta.clone().requires_grad_(True)
        with torch.enable_grad():
            ll = log_lik_components(cb, e)
            if reweight is not None:
                wb = reweight(bi * rows.batch_size, ll.detach(), wb)
            tot = (ll * wb).sum(0)
            (g,) = torch.autograd.grad(tot.sum(), e)
        L += tot.detach()
        G += g
        dense = (cb.to_dense() if isinstance(cb, SparseCounts) else cb).to(torch.float64)
        NA = Nb.unsqueeze(-1) + A
        D += (wb * (psi(NA) - psi(A))).sum(0)
        Z += (wb * (psi1(A) - psi1(NA))).sum(0)
        a = alpha.unsqueeze(0)                                      # (1, k, V)
        n = dense.unsqueeze(1)                                      # (b, 1, V)
        t = torch.where(n > 0, psi1(a + n) - psi1(a),
                        torch.zeros((), dtype=torch.float64))
        Q += (wb.unsqueeze(-1) * t).sum(0)
    flat = reduce(torch.cat([L, G.flatten(), D, Q.flatten(), Z]))
    L, G, D = flat[:k], flat[k:k + k * V].view(k, V), flat[k + k * V:2 * k + k * V]
    o = 2 * k + k * V
    Q, Z = flat[o:o + k * V].view(k, V), flat[o + k * V:]
    return engine.Stats(L.clone(), G.clone(), Q.clone() if hessian else None,
                        Z.clone() if hessian else None, D.clone())


def _scale(t):
    return float(t.abs().max())


def _draw(B, V, K, sparse, generator, integer=True):
    if sparse:
        x = random_sparse_counts(B, V, 0.15, dtype=torch.float64, generator=generator)
        if integer:
            x = x.round()
    else:
        x = torch.randint(0, 30, (B, V), generator=generator).double()
        x = x * (torch.rand(B, V, generator=generator) < 0.6)
        if not integer:
            x = x * torch.rand(B, V, generator=generator, dtype=torch.float64) * 2
    x[0, 0] = 5.0
    # concentrations from 1e-3 to 1e4: the reference's differences of
    # special functions stay accurate to ~1e-12 of the terms' size here
    eta = torch.empty(K, V, dtype=torch.float64).uniform_(
        math.log(1e-3), math.log(1e4), generator=generator)
    w = torch.rand(B, K, generator=generator, dtype=torch.float64)
    w[torch.rand(B, generator=generator) < 0.1] = 0.0              # some rows weigh nothing
    return x, eta, w


def _compare(S, R, eta, hessian):
    assert torch.allclose(S.L, R.L, rtol=0, atol=REL * _scale(R.L))
    assert torch.allclose(S.D, R.D, rtol=REL, atol=0)
    # G = alpha (num - D), num and D >= 0: relative to the larger part
    part = R.G.abs() + eta.exp() * R.D.unsqueeze(-1)
    assert bool(((S.G - R.G).abs() <= REL * part).all())
    if hessian:
        assert torch.allclose(S.Z, R.Z, rtol=REL, atol=0)
        assert torch.allclose(S.Q, R.Q, rtol=REL, atol=1e-300)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("batch_size", [None, 7])
@pytest.mark.parametrize("integer", [True, False])
def test_statistics_match_independent_route(sparse, batch_size, integer):
    g = torch.Generator().manual_seed(torch.seed())
    B, V, K = 41, 13, 3
    x, eta, w = _draw(B, V, K, sparse, g, integer)
    counts = SparseCounts.from_dense(x) if sparse else x
    for hessian in (True, False):
        rows = engine.Rows(counts, w, torch.device("cpu"), batch_size)
        engine.prepass(rows)
        S = engine.row_stats(rows, eta, None, hessian)
        R = oracle_row_stats(rows, eta, None, hessian)
        _compare(S, R, eta, hessian)
        # a subset of the weight columns (the engine's halvings)
        comps = torch.tensor([2, 0])
        S = engine.row_stats(rows, eta[comps], comps, hessian)
        R = oracle_row_stats(rows, eta[comps], comps, hessian)
        _compare(S, R, eta[comps], hessian)


@pytest.mark.parametrize("sparse", [False, True])
def test_reweighted_statistics_match(sparse):
    """The fused E-step's weights: the statistics under the responsibilities
    the pass itself computes, with a reduce hook that scales (a stand-in
    for the sum over ranks)."""
    g = torch.Generator().manual_seed(torch.seed())
    B, V, K = 60, 9, 4
    x, eta, w = _draw(B, V, K, sparse, g)
    counts = SparseCounts.from_dense(x) if sparse else x
    log_pi = torch.log_softmax(torch.randn(K, generator=g, dtype=torch.float64), 0)

    def reweight(start, ll, wb):
        return torch.softmax(ll + log_pi, -1)

    def reduce(t):
        return 2.0 * t

    rows = engine.Rows(counts, w, torch.device("cpu"), 16)
    engine.prepass(rows)
    S = engine.row_stats(rows, eta, None, True, reduce=reduce, reweight=reweight)
    R = oracle_row_stats(rows, eta, None, True, reduce=reduce, reweight=reweight)
    _compare(S, R, eta, True)


def test_one_column_unit_weights():
    """A plain fit's pass (one weight column of ones)."""
    g = torch.Generator().manual_seed(torch.seed())
    x, eta, _ = _draw(50, 11, 1, False, g)
    rows = engine.Rows(x, None, torch.device("cpu"), None)
    engine.prepass(rows)
    S = engine.row_stats(rows, eta, None, True)
    R = oracle_row_stats(rows, eta, None, True)
    _compare(S, R, eta, True)
    ref = log_lik(x, eta[0]).sum()
    assert abs(float(S.L[0]) - float(ref)) <= 1e-12 * abs(float(ref))


@pytest.mark.parametrize("sparse", [False, True])
def test_statistics_same_bits_every_run(sparse):
    g = torch.Generator().manual_seed(torch.seed())
    x, eta, w = _draw(300, 40, 3, sparse, g)
    counts = SparseCounts.from_dense(x) if sparse else x
    out = []
    for _ in range(2):
        rows = engine.Rows(counts, w, torch.device("cpu"), None)
        engine.prepass(rows)
        out.append(engine.row_stats(rows, eta, None, True))
    for name in ("L", "G", "Q", "Z", "D"):
        assert torch.equal(getattr(out[0], name), getattr(out[1], name)), name


def test_large_concentrations_accurate():
    """alpha up to 1e8, where psi(a + n) - psi(a) cancels: the statistics
    match the float64 sum of dpoch and tpoch terms by mpmath."""
    mpmath = pytest.importorskip("mpmath", reason="the exact reference")
    g = torch.Generator().manual_seed(torch.seed())
    B, V = 6, 4
    x = torch.randint(1, 40, (B, V), generator=g).double()
    eta = torch.empty(1, V, dtype=torch.float64).uniform_(math.log(1e5), math.log(1e8),
                                                          generator=g)
    rows = engine.Rows(x, None, torch.device("cpu"), None)
    engine.prepass(rows)
    S = engine.row_stats(rows, eta, None, True)
    mpmath.mp.dps = 50
    a = [mpmath.exp(mpmath.mpf(float(v))) for v in eta[0]]
    Amp = mpmath.fsum(a)
    N = x.sum(-1)
    D = mpmath.fsum(mpmath.digamma(Amp + float(n)) - mpmath.digamma(Amp) for n in N)
    Z = mpmath.fsum(mpmath.psi(1, Amp) - mpmath.psi(1, Amp + float(n)) for n in N)
    for v in range(V):
        q = mpmath.fsum(mpmath.psi(1, a[v] + float(n)) - mpmath.psi(1, a[v]) for n in x[:, v])
        assert abs(float(S.Q[0, v]) - float(q)) <= 1e-12 * abs(float(q))
        num = mpmath.fsum(mpmath.digamma(a[v] + float(n)) - mpmath.digamma(a[v])
                          for n in x[:, v])
        gv = a[v] * (num - D)
        # G is a difference of two sums of size a num: relative to those
        assert abs(float(S.G[0, v]) - float(gv)) <= 1e-12 * float(a[v] * num)
    assert abs(float(S.D[0]) - float(D)) <= 1e-12 * float(D)
    assert abs(float(S.Z[0]) - float(Z)) <= 1e-12 * float(Z)


def _fit_both(monkeypatch, counts, **kw):
    new = fit_mixture(counts, **kw)
    with monkeypatch.context() as m:
        m.setattr(engine, "row_stats", oracle_row_stats)
        m.setattr(mixture, "row_stats", oracle_row_stats)
        old = fit_mixture(counts, **kw)
    return new, old


def _assert_same_fit(new, old):
    assert abs(new.log_lik - old.log_lik) <= 1e-9 * abs(old.log_lik)
    assert new.n_iter == old.n_iter
    assert torch.allclose(new.log_alpha, old.log_alpha, rtol=1e-7, atol=1e-7)
    assert torch.allclose(new.weights, old.weights, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("sparse,batch_size", [(False, None), (True, None), (False, 37)])
def test_fit_mixture_matches_independent_statistics(monkeypatch, sparse, batch_size):
    g = torch.Generator().manual_seed(torch.seed())
    B, V, K = 120, 10, 3
    alpha = torch.exp(torch.empty(K, V, dtype=torch.float64).uniform_(-1, 2, generator=g))
    z = torch.randint(0, K, (B,), generator=g)
    p = torch.distributions.Dirichlet(alpha[z]).sample()
    x = torch.stack([torch.multinomial(p[b], 60, replacement=True, generator=g)
                     .bincount(minlength=V) for b in range(B)]).double()
    counts = SparseCounts.from_dense(x) if sparse else x
    kw = dict(k=K, seed=int(torch.randint(0, 2 ** 31, (1,), generator=g)), n_init=1,
              n_screen=1, max_iter=30, batch_size=batch_size)
    new, old = _fit_both(monkeypatch, counts, **kw)
    _assert_same_fit(new, old)


def test_fit_mixture_with_prior_matches(monkeypatch):
    g = torch.Generator().manual_seed(torch.seed())
    B, V, K = 90, 8, 2
    x = torch.randint(0, 15, (B, V), generator=g).double()
    x[:, 0] += 1
    kw = dict(k=K, seed=int(torch.randint(0, 2 ** 31, (1,), generator=g)), n_init=1,
              n_screen=1, max_iter=25, prior=GammaPrior(1.0, 1e-4))
    new, old = _fit_both(monkeypatch, x, **kw)
    _assert_same_fit(new, old)


@pytest.mark.parametrize("sparse", [False, True])
def test_prepass_reusing_row_totals_equals_a_fresh_one(sparse):
    from dirmult_ext.models.engine import Rows, prepass
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = torch.poisson(torch.rand(300, 40, generator=g) * 3, generator=g)
    x[7] = 0                                                    # an empty row
    counts = SparseCounts.from_dense(x) if sparse else x
    R = torch.distributions.Dirichlet(torch.ones(3)).sample((300,)).double()
    rows = Rows(counts, None, torch.device("cpu"), batch_size=64)
    prepass(rows)                                               # sets rows.N, rows.c
    rows.set_weights(R)
    reused = prepass(rows, check=False)
    fresh_rows = Rows(counts, R, torch.device("cpu"), batch_size=64)
    fresh = prepass(fresh_rows)
    for name in ("W", "C", "Wpos", "Sx", "Sx2", "Sinv"):
        torch.testing.assert_close(getattr(reused, name), getattr(fresh, name),
                                   rtol=1e-13, atol=0)
    torch.testing.assert_close(rows.c, fresh_rows.c, rtol=0, atol=0)
    torch.testing.assert_close(rows.N, x.double().sum(-1), rtol=0, atol=0)


@pytest.mark.parametrize("integer", [True, False])
def test_sparse_prepass_in_blocks_gives_the_same_bits(monkeypatch, integer):
    """On the CPU a large matrix's prepass goes a block of rows (of columns
    for the moments) at a time: each row's and column's sums in the order of
    its values, so the same bits as in one piece, and the float64 sums of
    the dense matrix."""
    from dirmult_ext.data import sparse_counts
    from dirmult_ext.likelihood.sparse_stats import fit_moments
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = torch.poisson(torch.rand(120, 30, generator=g) * 4, generator=g)
    x = x * (torch.rand(120, 30, generator=g) < 0.4)
    if not integer:
        x = x * torch.rand(120, 30, generator=g, dtype=torch.float32) * 2
    x[5] = 0                                                    # an empty row
    w = torch.rand(120, 3, generator=g, dtype=torch.float64)
    whole = fit_moments(SparseCounts.from_dense(x), w)
    monkeypatch.setattr(sparse_counts, "ROW_BLOCK_NNZ", int(torch.randint(5, 40, (1,))))
    sc = SparseCounts.from_dense(x)
    assert len(sc.row_blocks()) > 10
    blocked = fit_moments(sc, w)
    for a, b in zip(whole, blocked):
        assert torch.equal(a, b)
    N, bad, sx, sx2, c = blocked
    d = x.double()
    assert torch.equal(N, d.sum(-1)) and int(bad) == 0
    p = d / N.clamp_min(1e-300).unsqueeze(-1)
    wp = w * (N > 0).unsqueeze(-1)
    torch.testing.assert_close(sx, wp.T @ p, rtol=1e-13, atol=0)
    torch.testing.assert_close(sx2, wp.T @ (p * p), rtol=1e-13, atol=0)
    torch.testing.assert_close(c, torch.lgamma(N + 1) - torch.lgamma(d + 1).sum(-1),
                               rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_pairs_on_the_cpu_index_in_int32(sparse):
    """The (column, count) pairs' row matrix takes int32 indices on the CPU
    (no int64 per nonzero); its histograms are the sums of the weights of
    the rows holding each pair, the same bits as with int64 indices."""
    import warnings
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = torch.poisson(torch.rand(80, 12, generator=g) * 3, generator=g)
    x = x * (torch.rand(80, 12, generator=g) < 0.5)
    counts = SparseCounts.from_dense(x) if sparse else x
    rows = engine.Rows(counts, None, torch.device("cpu"), None)
    pr = rows.pairs(counts, 0)
    assert pr.M.crow_indices().dtype == pr.M.col_indices().dtype == torch.int32
    w = torch.rand(80, 4, generator=g, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wide = torch.sparse_csr_tensor(pr.M.crow_indices().long(), pr.M.col_indices().long(),
                                       pr.M.values(), pr.M.shape)
        got = pr.M @ w
        assert torch.equal(got, wide @ w)
    ref = torch.stack([(w * ((x[:, int(c)] == n).double()).unsqueeze(-1)).sum(0)
                       for c, n in zip(pr.col, pr.cnt)])
    torch.testing.assert_close(got, ref, rtol=1e-14, atol=0)
    assert bool((pr.cnt > 0).all()) and int(pr.M.values().numel()) == int((x > 0).sum())


def test_pairs_from_the_column_sorted_copy_are_the_sorts(monkeypatch):
    """Where the column-sorted copy is kept (built a block of rows at a
    time), the CPU's pairs come from it a block of columns at a time: the
    same pairs, rows and order as one stable sort of every key."""
    from dirmult_ext.data import sparse_counts
    from dirmult_ext.ops.csr import csc_parts
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = torch.poisson(torch.rand(150, 25, generator=g) * 3, generator=g)
    x = x * (torch.rand(150, 25, generator=g) < 0.4)
    x[3:9] = 0
    monkeypatch.setattr(sparse_counts, "ROW_BLOCK_NNZ", int(torch.randint(4, 60, (1,))))
    sc = SparseCounts.from_dense(x)
    rows = engine.Rows(sc, None, torch.device("cpu"), None)
    assert sc.kept_csc() is None
    sorted_once = rows.pairs(sc, 0)
    kept = sc.csc()
    assert all(torch.equal(a, b) for a, b in zip(
        kept, csc_parts(sc.crow_indices, sc.col_indices, sc.values, 25)))
    rows._pairs.clear()
    by_columns = rows.pairs(sc, 0)
    for a, b in zip(sorted_once, by_columns):
        if a.layout == torch.sparse_csr:
            assert all(torch.equal(f(a), f(b)) for f in (
                Tensor.crow_indices, Tensor.col_indices, Tensor.values))
        else:
            assert torch.equal(a, b)
