"""fit_regression's Newton iterations (method="newton", and "auto" below
its size): the same optimum as L-BFGS, a gradient of zero there by the
float64 formula, few iterations, weights and streaming, the Levenberg
safeguard where the Hessian is indefinite, the choice of "auto"."""
import io
import math

import pytest
import torch

import dirmult_ext.models.regression.fit as reg
from dirmult_ext import fit_regression
from dirmult_ext.models.regression.data import RegressionData, identity
from dirmult_ext.models.regression.newton import newton
from dirmult_ext.models.regression.optim import Problem, lbfgs

from reference import grad_float64, log_lik_float64, regression_counts as simulate


def random_problem(B, P, V, scale=0.5, generator=None):
    W = scale * torch.randn(P, V, dtype=torch.float64, generator=generator) / math.sqrt(P)
    b = 0.3 * torch.randn(V, dtype=torch.float64, generator=generator)
    counts, X = simulate(B, W, b, generator=generator)
    return counts, X


def float64_gradient(counts, X, r, weights=None, lam=0.0):
    """Gradient of -sum w log DM + lam/2 ||W||^2 in (W, bias) by the float64
    lgamma formula: (P, V) and (V,)."""
    G = grad_float64(counts, X @ r.W + r.bias, weights)       # d/d log alpha, (B, V)
    return -(X.T @ G) + lam * r.W, -G.sum(0)


@pytest.mark.parametrize("penalty,lam,bias,weighted", [
    (None, 0.0, True, False), (None, 0.0, False, False), ("l2", 25.0, True, False),
    (None, 0.0, True, True)])
def test_newton_reaches_the_lbfgs_optimum_in_few_iterations(penalty, lam, bias, weighted):
    g = torch.Generator().manual_seed(7301 + 10 * bool(penalty) + 2 * bias + weighted)
    counts, X = random_problem(200, 3, 6, generator=g)      # MGLM's example's scale
    X[:, 0] = 2 * X[:, 0] + 3                               # uncentered, unscaled
    w = torch.rand(200, dtype=torch.float64, generator=g) * 2 if weighted else None
    kw = dict(penalty=penalty, lam=lam, bias=bias, weights=w)
    nt = fit_regression(counts, X, method="newton", tol=1e-13, gtol=1e-10, **kw)
    # (L-BFGS's line search stalls at a gradient of about 1e-8)
    lb = fit_regression(counts, X, method="lbfgs", tol=1e-12, gtol=1e-7, **kw)
    assert nt.method == "newton" and nt.converged and lb.converged
    # quadratic convergence from the intercept-only start: an algorithmic bound
    assert nt.n_iter <= 10, nt.n_iter
    assert nt.n_iter < lb.n_iter
    torch.testing.assert_close(nt.W, lb.W, rtol=0, atol=1e-6)
    torch.testing.assert_close(nt.bias, lb.bias, rtol=0, atol=1e-6)
    # the objective is stationary at the optimum (for L2 the log-likelihood is not)
    assert math.isclose(nt.objective, lb.objective, rel_tol=1e-11)
    assert nt.objective <= lb.objective + 1e-13 * abs(lb.objective)     # no worse
    assert math.isclose(nt.log_lik, lb.log_lik, rel_tol=1e-11 if penalty is None else 1e-8)
    ll = (log_lik_float64(counts, X @ nt.W + nt.bias, normalize=True)
          * (1 if w is None else w)).sum()
    assert math.isclose(nt.log_lik, float(ll), rel_tol=1e-12)
    # stationary by the float64 formula (per unit row weight, unit-scale covariates)
    gW, gb = float64_gradient(counts, X, nt, w, lam)
    wsum = 200.0 if w is None else float(w.sum())
    assert float((gW * X.std(0).unsqueeze(-1)).abs().max()) / wsum < 1e-8, gW
    if bias:
        assert float(gb.abs().max()) / wsum < 1e-8, gb
    # the standard errors come from the same optimum
    torch.testing.assert_close(nt.se_W, lb.se_W, rtol=1e-5, atol=0)


def test_newton_at_3000_by_30():
    g = torch.Generator().manual_seed(9917)
    counts, X = random_problem(3000, 5, 30, generator=g)
    nt = fit_regression(counts, X, method="newton", se=False, tol=1e-13, gtol=1e-10)
    lb = fit_regression(counts, X, method="lbfgs", se=False, tol=1e-12, gtol=1e-7)
    assert nt.converged and nt.n_iter <= 10 and lb.n_iter > nt.n_iter
    torch.testing.assert_close(nt.W, lb.W, rtol=0, atol=1e-5)
    gW, gb = float64_gradient(counts, X, nt)
    assert float(gW.abs().max()) / 3000 < 1e-8 and float(gb.abs().max()) / 3000 < 1e-8
    assert math.isclose(nt.log_lik, lb.log_lik, rel_tol=1e-11)


def test_newton_streams_and_weights_equal_repeats():
    g = torch.Generator().manual_seed(4242)
    counts, X = random_problem(250, 2, 5, generator=g)
    full = fit_regression(counts, X, method="newton")
    s = fit_regression(counts, X, method="newton", batch_size=37)
    assert s.method == "newton" and s.converged and s.n_iter <= 10
    torch.testing.assert_close(s.W, full.W, rtol=0, atol=1e-8)
    assert math.isclose(s.log_lik, full.log_lik, rel_tol=1e-12)
    reps = torch.randint(0, 3, (250,), generator=g)
    reps[0] = 1
    idx = torch.arange(250).repeat_interleave(reps)
    a = fit_regression(counts, X, weights=reps.double(), method="newton")
    c = fit_regression(counts[idx], X[idx], method="newton")
    torch.testing.assert_close(a.W, c.W, rtol=0, atol=1e-7)
    assert math.isclose(a.log_lik, c.log_lik, rel_tol=1e-11)


def test_newton_from_an_indefinite_hessian_converges():
    """From a start far from the optimum, where the objective's Hessian (by
    autograd of the float64 formula) has a negative eigenvalue, the shifted
    Newton steps still reach the optimum L-BFGS finds."""
    g = torch.Generator().manual_seed(5150)
    counts, X = random_problem(300, 2, 4, generator=g)
    data = RegressionData(counts, X, None, "cpu", None)
    mu, s = X.mean(0), X.std(0, unbiased=False)
    data.set_standardization(mu, s)
    prob = Problem(data, True, None, 0.0, 300.0, identity)
    Xs = (X - mu) / s

    def f(theta):
        eta = Xs @ theta[:8].view(2, 4) + theta[8:]
        return -log_lik_float64(counts, eta).sum() / 300

    for _ in range(50):
        W0 = 2 * torch.randn(2, 4, dtype=torch.float64, generator=g)
        b0 = 2 * torch.randn(4, dtype=torch.float64, generator=g)
        H = torch.autograd.functional.hessian(f, torch.cat([W0.flatten(), b0]))
        if float(torch.linalg.eigvalsh(H)[0]) < -1e-3:
            break
    else:
        pytest.fail("no start with an indefinite Hessian drawn")
    Wn, bn, trace, n_iter, conv, gnorm = newton(prob, W0, b0, tol=1e-13, gtol=1e-10,
                                                max_iter=100, bar=None)
    assert conv and n_iter <= 30
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(trace, trace[1:]))   # monotone
    Wl, bl, *_ = lbfgs(prob, torch.zeros(2, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64),
                       tol=1e-13, gtol=1e-10, max_iter=2000, bar=None)
    torch.testing.assert_close(Wn, Wl, rtol=0, atol=1e-6)
    torch.testing.assert_close(bn, bl, rtol=0, atol=1e-6)
    theta = torch.cat([Wn.flatten(), bn]).requires_grad_(True)
    (gr,) = torch.autograd.grad(f(theta), theta)
    assert float(gr.abs().max()) < 1e-9


def test_auto_takes_newton_below_its_size(monkeypatch):
    g = torch.Generator().manual_seed(31337)
    counts, X = random_problem(150, 3, 4, generator=g)
    assert fit_regression(counts, X, se=False).method == "newton"
    assert fit_regression(counts, X, se=False, penalty="l2", lam=3.0).method == "newton"
    assert fit_regression(counts, X, se=False, penalty="group_lasso",
                          lam=3.0).method == "fista"
    monkeypatch.setattr(reg, "MAX_NEWTON_PARAMS", 15)            # (P + 1) V = 16
    assert fit_regression(counts, X, se=False).method == "lbfgs"
    assert fit_regression(counts, X, se=False, bias=False).method == "newton"   # 12
    monkeypatch.setattr(reg, "MAX_NEWTON_PARAMS", 1200)
    monkeypatch.setattr(reg, "MAX_NEWTON_WORK", 63)              # (P + 1)^2 V = 64
    assert fit_regression(counts, X, se=False).method == "lbfgs"
    with pytest.raises(ValueError, match="fista"):
        fit_regression(counts, X, penalty="group_lasso", lam=1.0, method="newton")
    with pytest.raises(ValueError, match="'newton'"):
        fit_regression(counts, X, method="irls")


def test_newton_reports_progress():
    g = torch.Generator().manual_seed(2718)
    counts, X = random_problem(150, 2, 4, generator=g)
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        r = fit_regression(counts, X, method="newton", progress=True, se=False)
    out = buf.getvalue()
    assert "fit_regression" in out and "objective" in out, out
    assert r.n_iter >= 1
