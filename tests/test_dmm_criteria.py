"""The Gamma prior and dmn's criteria of fit_mixture, against float64
evaluations written out here (lgamma, finite differences)."""
import math

import numpy as np
import pytest
import torch

from dirmult_ext.models.criteria import DMN_PRIOR, ModelSelection, resolve_prior
from dirmult_ext.models.mixture import fit_mixture

from reference import separated_mixture

ETA, NU = 0.1, 0.1          # dmn's GAMMA_ITA, GAMMA_NU


def dm_log_pmf(x, lam):
    """(B,) normalized log DM(x | exp(lam)) in float64, from lgamma."""
    x = x.double()
    a = lam.exp()
    N, A = x.sum(-1), a.sum()
    return (torch.lgamma(N + 1) - torch.lgamma(x + 1).sum(-1) + torch.lgamma(A)
            - torch.lgamma(A + N) + (torch.lgamma(a + x) - torch.lgamma(a)).sum(-1))


def log_prior(lam):
    return (ETA * lam - NU * lam.exp() + ETA * math.log(NU) - math.lgamma(ETA)).sum()


def component_objective(x, r, lam):
    """sum_b r_b log DM(x_b | exp(lam)) + log p(lam): what H_k differentiates."""
    return (r * dm_log_pmf(x, lam)).sum() + log_prior(lam)


def fd_hessian(f, lam, h=1e-4):
    V = lam.shape[0]
    H = torch.empty(V, V, dtype=torch.float64)
    E = torch.eye(V, dtype=torch.float64) * h
    for i in range(V):
        for j in range(V):
            H[i, j] = (f(lam + E[i] + E[j]) - f(lam + E[i] - E[j])
                       - f(lam - E[i] + E[j]) + f(lam - E[i] - E[j])) / (4 * h * h)
    return H


def test_laplace_against_finite_differences():
    """dmn: Laplace = NLE + 1/2 logdet - p/2 log(2 pi), logdet = sum_k
    log|det H_k| + sum_{k>=2} (2 log B - log W_k); BIC = NLE + p/2 log B;
    AIC = NLE + p. Tolerances: central differences with h = 1e-4 on
    objectives of size ~1e3 carry ~1e-6 relative error per Hessian entry."""
    B, V, K = 150, 5, 2
    x, _, _ = separated_mixture(B=B, V=V, K=K, seed=int(torch.randint(0, 10**6, ())))
    m = fit_mixture(x, K, seed=1, prior="dmn", n_init=2)
    lam, pi, R = m.log_alpha, m.weights, m.responsibilities
    joint = torch.stack([dm_log_pmf(x, lam[k]) for k in range(K)], -1) + pi.log()
    log_lik = float(torch.logsumexp(joint, -1).sum())
    lp = float(sum(log_prior(lam[k]) for k in range(K)))
    assert math.isclose(m.log_lik, log_lik, rel_tol=1e-9)
    assert math.isclose(m.log_prior, lp, rel_tol=1e-12)
    nle = -(log_lik + lp)
    logdet = 0.0
    blocks = m.hessian_blocks()
    for k in range(K):
        H = -fd_hessian(lambda l: component_objective(x, R[:, k], l), lam[k])
        torch.testing.assert_close(blocks[k], H, rtol=1e-4, atol=1e-4)
        sign, ld = np.linalg.slogdet(H.numpy())
        logdet += ld
    W = R.sum(0)
    logdet += float(sum(2 * math.log(B) - math.log(W[k]) for k in range(1, K)))
    p = K * V + K - 1
    assert math.isclose(m.laplace, nle + 0.5 * logdet - 0.5 * p * math.log(2 * math.pi),
                        rel_tol=1e-7)
    assert math.isclose(m.bic, nle + 0.5 * p * math.log(B), rel_tol=1e-12)
    assert math.isclose(m.aic, nle + p, rel_tol=1e-12)


def test_prior_maximizes_the_penalized_objective():
    """The MAP fit has the higher log posterior, the MLE the higher
    log-likelihood (both evaluated here). A column a component never sees:
    the MLE drives its alpha to the floor (1e-6); the prior's gradient
    eta - nu alpha holds it where the data's, about -alpha W log((A + N)/A)
    ~ -200 alpha here, balances it: ~5e-4."""
    B, V, K = 200, 6, 2
    x, z, _ = separated_mixture(B=B, V=V, K=K, seed=int(torch.randint(0, 10**6, ())))
    x = x.clone()
    x[z == 0, V - 1] = 0                      # component 0 never sees the last column
    fits = {pr: fit_mixture(x, K, seed=4, prior=pr, tol=1e-10, max_iter=500)
            for pr in (None, "dmn")}

    def evaluate(m):
        j = torch.stack([dm_log_pmf(x, m.log_alpha[k]) for k in range(K)], -1) + m.weights.log()
        ll = float(torch.logsumexp(j, -1).sum())
        return ll, ll + float(sum(log_prior(m.log_alpha[k]) for k in range(K)))

    ll_mle, post_mle = evaluate(fits[None])
    ll_map, post_map = evaluate(fits["dmn"])
    assert ll_mle > ll_map and post_map > post_mle, (ll_mle, ll_map, post_mle, post_map)
    assert math.isclose(fits["dmn"].log_lik_trace[-1], post_map, rel_tol=1e-8)
    for m, bound in ((fits[None], lambda a: a < 1e-5), (fits["dmn"], lambda a: a > 1e-4)):
        k0 = int(m.responsibilities[z == 0].sum(0).argmax())
        assert bound(float(m.alpha[k0, V - 1])), m.alpha[k0]
    t = np.asarray(fits["dmn"].log_lik_trace)
    assert np.all(np.diff(t) >= -1e-9 * abs(t[-1])), t      # the log posterior never drops


def test_model_selection_picks_the_true_k():
    x, _, _ = separated_mixture(B=240, V=8, K=3, seed=int(torch.randint(0, 10**6, ())))
    sel = fit_mixture(x, range(1, 5), seed=0, prior="dmn", n_init=2)
    assert isinstance(sel, ModelSelection) and sel.ks == [1, 2, 3, 4]
    assert sel.best_k == 3 and sel.best.n_components == 3
    tab = sel.table()
    assert tab["k"] == [1, 2, 3, 4]
    assert tab["laplace"] == [m.laplace for m in sel.fits]
    assert all(a <= b + 1e-6 for a, b in zip(tab["log_lik"][:3], tab["log_lik"][1:3]))
    text = sel.format_table()
    assert "Laplace" in text and "chosen k by Laplace: 3" in text


def test_prior_and_k_errors():
    x, _, _ = separated_mixture(B=20, V=4, K=2)
    assert resolve_prior("dmn") == DMN_PRIOR and resolve_prior(None) is None
    assert resolve_prior((1.0, 2.0)).rate == 2.0
    for bad in ("gamma", (0.0, 1.0), (1.0, -1.0), 3):
        with pytest.raises(ValueError, match="prior"):
            fit_mixture(x, 2, prior=bad)
    with pytest.raises(ValueError, match="rows"):
        fit_mixture(x, range(1, 30))
    with pytest.raises(ValueError, match="k"):
        fit_mixture(x, [2, 2])
    with pytest.raises(TypeError, match="k"):
        fit_mixture(x, True)


def dmn_c_hessian(x, lam, pi, weighted):
    """DirichletMultinomial's C hessian() (dirichlet_fit_main.c) as written
    there, a dense V x V matrix in float64 with scipy's psi functions.
    weighted=False: dmn's sums adCJK0/adCJK (psi(alpha + n) where pi > 0 and
    n > 0, else psi(alpha), unweighted); True: every per-row term times pi."""
    from scipy.special import digamma, polygamma
    x, a, pi = x.double().numpy(), lam.exp().numpy(), pi.numpy()
    B, V = x.shape
    A = a.sum()
    H = np.empty((V, V))
    cjk0, cjk, ajk0, ajk = (np.zeros(V) for _ in range(4))
    for j in range(V):
        for i in range(B):
            n = x[i, j]
            if weighted:
                cjk0[j] += pi[i] * digamma(a[j] + n)
                cjk[j] += pi[i] * polygamma(1, a[j] + n)
            else:
                cjk0[j] += digamma(a[j] + n) if (pi[i] and n) else digamma(a[j])
                cjk[j] += polygamma(1, a[j] + n) if (pi[i] and n) else polygamma(1, a[j])
            ajk0[j] += pi[i] * digamma(a[j])
            ajk[j] += pi[i] * polygamma(1, a[j])
    w = pi.sum()
    ck = sum(pi[i] * polygamma(1, A + x[i].sum()) for i in range(B))
    ck0 = sum(pi[i] * digamma(A + x[i].sum()) for i in range(B))
    ak, ak0 = w * polygamma(1, A), w * digamma(A)
    for i in range(V):
        for j in range(V):
            if i == j:
                H[i, j] = (-a[i] * (ak0 - ck0 + cjk0[i] - ajk0[i])
                           - a[i] * a[i] * (ak - ck + cjk[i] - ajk[i]) + a[i] * NU)
            else:
                H[i, j] = -a[i] * a[j] * (ak - ck)
    return H


def dmn_c_laplace(x, m, weighted):
    """dmn's fit_laplace from the hessian above (components in m's order)."""
    B, V = x.shape
    K = m.n_components
    R = m.responsibilities
    logdet = 0.0
    for k in range(K):
        if k > 0:
            logdet += 2 * math.log(B) - math.log(float(R[:, k].sum()))
        logdet += np.linalg.slogdet(dmn_c_hessian(x, m.log_alpha[k], R[:, k], weighted))[1]
    p = K * V + K - 1
    nle = -(m.log_lik + m.log_prior)
    return nle + 0.5 * logdet - 0.5 * p * math.log(2 * math.pi)


def test_dmn_laplace_compatibility_value():
    """dmn_laplace reproduces dmn's C formula (unweighted per-row psi sums);
    the mixture's own laplace stays the weighted one, and the two differ
    for k = 2 (they coincide for k = 1, where every responsibility is 1)."""
    pytest.importorskip("scipy", reason="the reference psi functions come from scipy")
    from dirmult_ext.models.dmn_compat import dmn_laplace
    B, V, K = 60, 4, 2
    x, _, _ = separated_mixture(B=B, V=V * 2, K=K, seed=int(torch.randint(0, 10**6, ())))
    x = x[:, :V]                                   # overlapping components
    m = fit_mixture(x, K, seed=2, prior="dmn", n_init=1)
    weighted, dmn = dmn_c_laplace(x, m, True), dmn_c_laplace(x, m, False)
    assert math.isclose(m.laplace, weighted, rel_tol=1e-8), (m.laplace, weighted)
    assert math.isclose(dmn_laplace(m, x), dmn, rel_tol=1e-8), (dmn_laplace(m, x), dmn)
    assert abs(dmn - weighted) > 1e-3 * abs(weighted) or abs(dmn - weighted) > 1.0
    m1 = fit_mixture(x, 1, prior="dmn")
    assert math.isclose(dmn_laplace(m1, x), m1.laplace, rel_tol=1e-9)
    with pytest.raises(ValueError, match="counts"):
        dmn_laplace(m, x[:10])
