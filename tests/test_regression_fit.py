"""Dirichlet-multinomial regression (fit_regression, DMRegressionFit,
DirichletMultinomialRegression): recovery of a known W, stationarity,
penalties, streaming, data-parallel, standard errors (exact against
autograd's Hessian, CG against exact, calibration), the module, bad input."""
import copy
import math
import os
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dirmult_ext
import dirmult_ext.models.regression.fit as reg
from dirmult_ext import DirichletMultinomialRegression, fit_regression

from reference import regression_counts as simulate


def random_problem(B=300, P=2, V=4, scale=0.5):
    W = scale * torch.randn(P, V, dtype=torch.float64)
    b = 0.3 * torch.randn(V, dtype=torch.float64)
    counts, X = simulate(B, W, b)
    return counts, X, W, b


def objective(counts, X, penalty=None, lam=0.0, bias=True):
    """The float64 objective -L + pen of the original coordinates, as a
    function of theta = (W flattened, bias)."""
    P, V = X.shape[1], counts.shape[1]

    def f(theta):
        W = theta[:P * V].view(P, V)
        eta = X @ W + (theta[P * V:] if bias else 0)
        val = -dirmult_ext.log_lik(counts.double(), eta).sum()
        if penalty == "l2":
            val = val + lam / 2 * (W * W).sum()
        elif penalty == "group_lasso":
            val = val + lam * W.norm(dim=1).sum()
        return val
    return f


def theta_of(r):
    return torch.cat([r.W.flatten(), r.bias] if r.has_bias else [r.W.flatten()])


# ---------------------------------------------------------------- recovery, stationarity
def test_recovers_known_coefficients():
    W = torch.tensor([[0.8, -0.5, 0.0, 0.3], [-0.4, 0.6, 0.5, -0.2]], dtype=torch.float64)
    b = torch.tensor([0.2, -0.3, 0.5, 0.0], dtype=torch.float64)
    counts, X = simulate(2000, W, b)
    r = fit_regression(counts, X)
    assert r.converged and r.se_method == "exact" and r.grad_norm <= 1e-6
    # every coefficient within 4.5 standard errors (a failure chance ~1e-4 in all)
    assert bool(((r.W - W).abs() < 4.5 * r.se_W).all()), (r.W, W, r.se_W)
    assert bool(((r.bias - b).abs() < 4.5 * r.se_bias).all())
    assert float((r.W - W).abs().max()) < 0.25
    # the reported log-likelihood is the normalized pmf at the estimate
    ll = dirmult_ext.log_lik(counts.double(), X @ r.W + r.bias, normalize=True).sum()
    assert math.isclose(r.log_lik, float(ll), rel_tol=1e-12)
    assert r.log_lik > r.null_log_lik
    null = dirmult_ext.fit(counts)
    assert math.isclose(r.null_log_lik, null.log_lik, rel_tol=1e-9)
    # predictions
    Xn = torch.randn(7, 2, dtype=torch.float64)
    torch.testing.assert_close(r.predict_log_alpha(Xn), Xn @ r.W + r.bias)
    pr = r.predict(Xn.numpy())
    torch.testing.assert_close(pr.sum(-1), torch.ones(7, dtype=torch.float64))
    assert bool((pr > 0).all())


@pytest.mark.parametrize("penalty,lam", [(None, 0.0), ("l2", 30.0)])
def test_gradient_vanishes_at_the_optimum(penalty, lam):
    counts, X, W, b = random_problem(B=400, P=3, V=5)
    X[:, 1] = 3 * X[:, 1] + 10          # uncentered, unscaled covariates
    r = fit_regression(counts, X, penalty=penalty, lam=lam)
    assert r.converged
    theta = theta_of(r).requires_grad_(True)
    (g,) = torch.autograd.grad(objective(counts, X, penalty, lam)(theta), theta)
    # per row and relative to the curvature scale (unit-variance covariates)
    scale = torch.cat([X.std(0).repeat_interleave(5), torch.ones(5, dtype=torch.float64)])
    assert float((g / scale).abs().max()) / counts.shape[0] < 5e-6, g


def test_no_bias():
    counts, X, W, b = random_problem(B=300)
    r = fit_regression(counts, X, bias=False)
    assert r.converged and not r.has_bias
    assert bool((r.bias == 0).all()) and bool(torch.isnan(r.se_bias).all())
    assert math.isnan(r.null_log_lik)
    f = objective(counts, X, bias=False)
    theta = r.W.flatten().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(theta), theta)
    assert float(g.abs().max()) / counts.shape[0] < 1e-5
    H = torch.autograd.functional.hessian(f, r.W.flatten())
    torch.testing.assert_close(r.cov, torch.linalg.inv(H), rtol=1e-6, atol=1e-10)
    assert all(row["covariate"] != reg.INTERCEPT for row in r.to_table())


# ---------------------------------------------------------------- standard errors
@pytest.mark.parametrize("penalty,lam", [(None, 0.0), ("l2", 20.0), ("group_lasso", 15.0)])
def test_standard_errors_are_the_inverse_autograd_hessian(penalty, lam):
    counts, X, W, b = random_problem(B=200, P=2, V=4)
    X[:, 0] += 2.0
    r = fit_regression(counts, X, penalty=penalty, lam=lam)
    assert r.converged and r.se_method == "exact"
    assert bool((r.W.norm(dim=1) > 0).all())   # (both rows nonzero at this lam)
    H = torch.autograd.functional.hessian(objective(counts, X, penalty, lam), theta_of(r))
    cov = torch.linalg.inv(H)
    torch.testing.assert_close(r.cov, cov, rtol=1e-6, atol=1e-10)
    se = cov.diagonal().sqrt()
    torch.testing.assert_close(r.se_W.flatten(), se[:8], rtol=1e-6, atol=0)
    torch.testing.assert_close(r.se_bias, se[8:], rtol=1e-6, atol=0)
    z = r.W / r.se_W
    torch.testing.assert_close(r.z_W, z)
    p = torch.tensor([math.erfc(abs(float(t)) / math.sqrt(2)) for t in z.flatten()],
                     dtype=torch.float64).view(2, 4)
    torch.testing.assert_close(r.p_W, p, rtol=1e-10, atol=1e-300)


def test_cg_standard_errors_above_the_exact_limit(monkeypatch):
    counts, X, W, b = random_problem(B=250, P=3, V=4)
    X[:, 2] = 0.5 * X[:, 2] - 4
    exact = fit_regression(counts, X, covariate_names=["a", "b", "c"])
    monkeypatch.setattr(reg, "MAX_EXACT_SE_PARAMS", 10)
    with pytest.warns(RuntimeWarning, match="se_for"):
        none = fit_regression(counts, X)
    assert none.se_method is None and bool(torch.isnan(none.se_W).all())
    r = fit_regression(counts, X, covariate_names=["a", "b", "c"], se_for=["c", 0, "(intercept)"])
    assert r.se_method == "cg" and r.cov is None
    torch.testing.assert_close(r.se_W[[0, 2]], exact.se_W[[0, 2]], rtol=1e-6, atol=0)
    torch.testing.assert_close(r.se_bias, exact.se_bias, rtol=1e-6, atol=0)
    assert bool(torch.isnan(r.se_W[1]).all()) and bool(torch.isnan(r.p_W[1]).all())
    with pytest.raises(ValueError, match="se_for"):
        fit_regression(counts, X, se_for=["nope"])


def test_wald_intervals_are_calibrated():
    """Under the model, with a null covariate: the 95% Wald intervals cover
    the truth about 95% of the time and the null covariate's tests reject
    about 5% of the time (30 simulations x 15 coefficients; the bounds are
    about 4 binomial standard deviations wide)."""
    g = torch.Generator().manual_seed(20261201)
    W = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0], [0.6, -0.4, 0.2, 0.0, -0.5]],
                     dtype=torch.float64)
    b = torch.tensor([0.3, 0.0, -0.3, 0.5, -0.2], dtype=torch.float64)
    cover, total, reject = 0, 0, 0
    pvals = []
    for _ in range(30):
        counts, X = simulate(250, W, b, generator=g, n_lo=10, n_hi=60)
        r = fit_regression(counts, X)
        est = torch.cat([r.W, r.bias.unsqueeze(0)])
        se = torch.cat([r.se_W, r.se_bias.unsqueeze(0)])
        truth = torch.cat([W, b.unsqueeze(0)])
        cover += int(((est - truth).abs() <= 1.959964 * se).sum())
        total += est.numel()
        reject += int((r.p_W[0] < 0.05).sum())
        pvals += r.p_W[0].tolist()
    coverage = cover / total
    assert 0.91 <= coverage <= 0.985, coverage
    assert reject / len(pvals) <= 0.11, reject
    # the null p-values are spread over (0, 1): a quarter or so in each quarter
    q = np.histogram(pvals, bins=[0, 0.25, 0.5, 0.75, 1.0])[0] / len(pvals)
    assert q.min() > 0.12, q


# ---------------------------------------------------------------- penalties
def test_group_lasso_zeroes_rows():
    W = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.9, -0.6, 0.4, -0.3], [0.0, 0.0, 0.0, 0.0]],
                     dtype=torch.float64)
    b = torch.tensor([0.2, 0.0, -0.2, 0.4], dtype=torch.float64)
    counts, X = simulate(400, W, b)
    # lam_max: the largest row norm of the gradient at W = 0, bias at the single-DM fit
    null = dirmult_ext.fit(counts)
    W0 = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    nll = -dirmult_ext.log_lik(counts.double(), X @ W0 + null.log_alpha).sum()
    (g0,) = torch.autograd.grad(nll, W0)
    lam_max = float(g0.norm(dim=1).max())
    r = fit_regression(counts, X, penalty="group_lasso", lam=1.01 * lam_max)
    assert r.converged and bool((r.W == 0).all())
    assert bool(torch.isnan(r.se_W).all()) and not bool(torch.isnan(r.se_bias).any())
    # just below lam_max the strongest covariate (row 1) enters first
    r = fit_regression(counts, X, penalty="group_lasso", lam=0.9 * lam_max)
    assert r.converged and bool((r.W.norm(dim=1) > 0).eq(torch.tensor([False, True, False])).all())
    # at half of it the null rows stay exactly zero (their gradient norms are
    # about 30 +- 16, lam about 230) and the real one is not
    lam = 0.5 * lam_max
    r = fit_regression(counts, X, penalty="group_lasso", lam=lam)
    assert r.converged
    nz = r.W.norm(dim=1) > 0
    assert bool(nz[1]) and not bool(nz[0]) and not bool(nz[2]), r.W
    assert bool((r.W[~nz] == 0).all())
    assert bool(torch.isnan(r.se_W[~nz]).all()) and bool(torch.isfinite(r.se_W[nz]).all())
    # KKT: zero rows' gradient within lam, nonzero rows stationary
    theta = theta_of(r).requires_grad_(True)
    (g,) = torch.autograd.grad(objective(counts, X)(theta), theta)
    gW, gb = g[:12].view(3, 4), g[12:]
    assert float(gW[~nz].norm(dim=1).max()) <= lam * (1 + 1e-6)
    w = r.W[nz]
    resid = gW[nz] + lam * w / w.norm(dim=1, keepdim=True)
    assert float(resid.abs().max()) / 400 < 1e-5 and float(gb.abs().max()) / 400 < 1e-5
    # FISTA on the unpenalized problem reaches L-BFGS's optimum
    a = fit_regression(counts, X, method="fista")
    c = fit_regression(counts, X)
    torch.testing.assert_close(a.W, c.W, rtol=0, atol=1e-4)


def test_l2_shrinks_and_is_the_penalized_optimum():
    counts, X, W, b = random_problem(B=300, P=3, V=4, scale=0.7)
    norms = []
    for lam in (0.0, 10.0, 100.0, 1e4):
        r = fit_regression(counts, X, penalty="l2" if lam else None, lam=lam)
        assert r.converged
        norms.append(float(r.W.norm()))
        if lam:
            pen = lam / 2 * float((r.W * r.W).sum())
            assert math.isclose(r.objective, -r.log_lik + pen, rel_tol=1e-12)
    assert norms == sorted(norms, reverse=True) and norms[-1] < 0.05 * norms[0], norms


# ---------------------------------------------------------------- streaming, weights, data-parallel
def test_streaming_equals_full_batch_and_weights_equal_repeats():
    counts, X, W, b = random_problem(B=330, P=2, V=5)
    full = fit_regression(counts, X)
    for bs in (37, 330, 1000):
        s = fit_regression(counts, X, batch_size=bs)
        torch.testing.assert_close(s.W, full.W, rtol=0, atol=1e-6)
        torch.testing.assert_close(s.se_W, full.se_W, rtol=1e-5, atol=0)
        assert math.isclose(s.log_lik, full.log_lik, rel_tol=1e-11)
    gl_full = fit_regression(counts, X, penalty="group_lasso", lam=5.0)
    gl_s = fit_regression(counts, X, penalty="group_lasso", lam=5.0, batch_size=50)
    torch.testing.assert_close(gl_s.W, gl_full.W, rtol=0, atol=1e-6)
    # integer weights are repeated rows
    w = torch.randint(0, 3, (330,))
    w[0] = 1
    idx = torch.arange(330).repeat_interleave(w)
    a = fit_regression(counts, X, weights=w.double())
    c = fit_regression(counts[idx], X[idx])
    # (two optimizer paths: equal to the tolerance, a small fraction of an SE)
    assert float(((a.W - c.W).abs() / c.se_W).max()) < 2e-3
    torch.testing.assert_close(a.se_W, c.se_W, rtol=1e-5, atol=0)
    assert math.isclose(a.log_lik, c.log_lik, rel_tol=1e-10)


SPLIT = 123


def _worker(rank, world, init_file, data_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        d = torch.load(data_file)
        sl = slice(0, SPLIT) if rank == 0 else slice(SPLIT, None)
        grp = dist.group.WORLD
        out = {}
        r = fit_regression(d["counts"][sl], d["X"][sl], group=grp)
        out["plain"] = (r.W, r.bias, r.se_W, r.log_lik, r.n_iter, r.n_rows)
        r = fit_regression(d["counts"][sl], d["X"][sl], group=grp, penalty="group_lasso",
                           lam=8.0, batch_size=40)
        out["group_lasso"] = (r.W, r.bias, r.se_W, r.log_lik, r.n_iter, r.n_rows)
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # (processes of their own: runs in CI, `-m slow`)
def test_two_gloo_ranks_equal_the_single_process_fit(tmp_path):
    counts, X, W, b = random_problem(B=300, P=2, V=4)
    data_file = str(tmp_path / "data.pt")
    torch.save({"counts": counts, "X": X}, data_file)
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), data_file, str(tmp_path)), nprocs=2,
             join=True)
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    refs = {"plain": fit_regression(counts, X),
            "group_lasso": fit_regression(counts, X, penalty="group_lasso", lam=8.0)}
    for name, ref in refs.items():
        for r in range(2):
            Wr, br, ser, ll, n_iter, n_rows = res[r][name]
            assert n_rows == 300
            torch.testing.assert_close(Wr, ref.W, rtol=0, atol=1e-6)
            torch.testing.assert_close(br, ref.bias, rtol=0, atol=1e-6)
            torch.testing.assert_close(ser, ref.se_W, rtol=1e-5, atol=0)
            assert math.isclose(ll, ref.log_lik, rel_tol=1e-10)
        # both ranks took the same steps
        assert torch.equal(res[0][name][0], res[1][name][0])


# ---------------------------------------------------------------- results
def test_tables_names_and_summary(tmp_path):
    counts, X, W, b = random_problem(B=200, P=2, V=3)
    r = fit_regression(counts, X, covariate_names=["age", "ph"],
                       category_names=["A", "B", "C"])
    rows = r.to_table()
    assert len(rows) == 9 and set(rows[0]) == {"covariate", "category", "estimate", "se",
                                               "z", "p"}
    ps = [row["p"] for row in rows]
    assert ps == sorted(ps)
    row = next(x for x in rows if x["covariate"] == "ph" and x["category"] == "B")
    assert row["estimate"] == float(r.W[1, 1]) and row["se"] == float(r.se_W[1, 1])
    assert len(r.to_table(include_intercept=False)) == 6
    text = r.summary(top=3)
    assert "age" in text or "ph" in text
    assert "3 more" in text
    path = tmp_path / "t.csv"
    r.to_csv(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "covariate,category,estimate,se,z,p" and len(lines) == 10


# ---------------------------------------------------------------- the module
def test_module_forward_compile_and_script():
    P, V = 6, 5
    m = DirichletMultinomialRegression(P, V)
    x = torch.randn(40, P)
    counts = torch.randint(0, 8, (40, V)).float()
    counts[:, 0] += 1
    ll = m(x, counts)
    ref = dirmult_ext.log_lik(counts, x @ m.weight + m.bias)
    torch.testing.assert_close(ll, ref)
    torch.testing.assert_close(m.predict(x), torch.softmax(m.log_alpha(x), -1))

    def train_step(model, opt):
        opt.zero_grad()
        loss = -model(x, counts).mean()
        loss.backward()
        opt.step()
        return loss.detach()

    eager, comp = copy.deepcopy(m), copy.deepcopy(m)
    # (SGD: Adam's first step is about lr * sign(grad), which rounding can flip
    # for an entry near zero)
    oe = torch.optim.SGD(eager.parameters(), lr=0.05)
    oc = torch.optim.SGD(comp.parameters(), lr=0.05)
    # (aot_eager: dynamo's graph and AOT autograd through the op's fake kernel and
    # registered backward, without inductor's C++ compile time)
    compiled = torch.compile(comp, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        le, lc = train_step(eager, oe), train_step(compiled, oc)
        torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(comp.weight, eager.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comp.bias, eager.bias, rtol=1e-5, atol=1e-6)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        s = torch.jit.script(m)
        s0 = torch.jit.script(DirichletMultinomialRegression(P, V, bias=False, normalize=True))
    torch.testing.assert_close(s(x, counts), m(x, counts))
    torch.testing.assert_close(s.predict(x), m.predict(x))
    m0 = DirichletMultinomialRegression(P, V, bias=False, normalize=True)
    m0.load_state_dict(s0.state_dict())
    torch.testing.assert_close(s0(x, counts), m0(x, counts))
    torch.testing.assert_close(m0(x, counts), dirmult_ext.log_lik(counts, x @ m0.weight,
                                                                   normalize=True))
    with pytest.raises(ValueError, match="in_features"):
        m(torch.randn(4, P + 1), counts[:4])
    with pytest.raises(ValueError, match="num_categories"):
        m(x, counts[:, :3])


def test_module_training_approaches_the_mle():
    counts, X, W, b = random_problem(B=300, P=2, V=4)
    m = DirichletMultinomialRegression(2, 4, dtype=torch.float64)
    opt = torch.optim.LBFGS(m.parameters(), max_iter=200, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-10, tolerance_change=1e-14)

    def closure():
        opt.zero_grad()
        loss = -m(X, counts.double()).mean()
        loss.backward()
        return loss
    for _ in range(3):
        opt.step(closure)
    r = fit_regression(counts, X)
    torch.testing.assert_close(m.weight.detach(), r.W, rtol=0, atol=1e-4)


# ---------------------------------------------------------------- bad input
def test_bad_input_errors_name_the_argument():
    counts, X, W, b = random_problem(B=50, P=2, V=3)
    with pytest.raises(ValueError, match=r"X has 49 rows but counts has 50"):
        fit_regression(counts, X[:49])
    Xn = X.clone()
    Xn[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"X must be finite: nan at row 4, column 2 \(1-based"):
        fit_regression(counts, Xn)
    with pytest.raises(TypeError, match=r"X must be numeric"):
        fit_regression(counts, np.array([["a", "b"]] * 50))
    with pytest.raises(TypeError, match=r"X must be a torch.Tensor"):
        fit_regression(counts, [[1.0, 2.0]] * 50)
    bad = counts.clone()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match="counts must be finite and non-negative"):
        fit_regression(bad, X)
    with pytest.raises(ValueError, match="nothing to fit"):
        fit_regression(torch.zeros(50, 3), X, bias=False)
    with pytest.raises(ValueError, match="counts must be a"):
        fit_regression(counts[0], X)
    Xc = X.clone()
    Xc[:, 1] = 2.5
    with pytest.raises(ValueError, match=r"X column 2 \(x2\) is constant"):
        fit_regression(counts, Xc)
    fit_regression(counts, Xc, bias=False, se=False)       # (a constant is fine without a bias)
    with pytest.raises(ValueError, match="penalty"):
        fit_regression(counts, X, penalty="lasso")
    with pytest.raises(ValueError, match="lam"):
        fit_regression(counts, X, lam=1.0)
    with pytest.raises(ValueError, match="lam"):
        fit_regression(counts, X, penalty="l2", lam=-1.0)
    with pytest.raises(ValueError, match="fista"):
        fit_regression(counts, X, penalty="group_lasso", lam=1.0, method="lbfgs")
    with pytest.raises(ValueError, match="weights"):
        fit_regression(counts, X, weights=torch.ones(49))
    with pytest.raises(ValueError, match="covariate_names"):
        fit_regression(counts, X, covariate_names=["a"])
    with pytest.raises(ValueError, match="batch_size"):
        fit_regression(counts, X, batch_size=0)
    r = fit_regression(counts, X, se=False)
    with pytest.raises(ValueError, match="X has 3 columns"):
        r.predict(torch.randn(4, 3))
