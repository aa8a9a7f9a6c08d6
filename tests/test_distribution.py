"""DirichletMultinomial distribution: log_prob against scipy and Pyro's
formula, moments, sampling, support and validation. Value tests draw fresh
random inputs each run (no fixed seeds)."""
import numpy as np
import pytest
import scipy.stats
import torch

import dirmult_ext
from dirmult_ext.likelihood import distribution as dmod
from dirmult_ext.likelihood.distribution import DirichletMultinomial, MultinomialCounts

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS else [])


def pyro_log_prob(alpha, value):
    """Pyro's DirichletMultinomial.log_prob (dense case), float64:
    log B1(A, N) - sum_v log B1(alpha_v, n_v), log B1(a, n) =
    lgamma(1 + n) + lgamma(a) - lgamma(a + n)."""
    alpha, value = alpha.double(), value.double()

    def log_beta_1(a, n):
        return torch.lgamma(1 + n) + torch.lgamma(a) - torch.lgamma(a + n)

    return log_beta_1(alpha.sum(-1), value.sum(-1)) - log_beta_1(alpha, value).sum(-1)


def rand_alpha(*shape, device="cpu"):
    return (torch.rand(*shape, dtype=torch.float64, device=device) * 3 + 0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_log_prob_matches_scipy(device):
    V = int(torch.randint(2, 12, ()).item())
    n = int(torch.randint(1, 60, ()).item())
    alpha = rand_alpha(V, device=device)
    d = DirichletMultinomial(n, alpha, validate_args=True)
    x = d.sample((50,))
    assert x.shape == (50, V) and x.device.type == device
    ours = d.log_prob(x).cpu().numpy()
    ref = scipy.stats.dirichlet_multinomial(alpha.cpu().numpy(), n).logpmf(x.cpu().numpy())
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_log_prob_matches_pyro_formula_with_broadcasting(device):
    V = 7
    alpha = rand_alpha(3, V, device=device)                  # batch_shape (3,)
    totals = torch.randint(0, 40, (3,), device=device)
    d = DirichletMultinomial(totals, alpha)
    assert d.batch_shape == (3,) and d.event_shape == (V,)
    x = d.sample((5,))                                       # (5, 3, V)
    assert x.shape == (5, 3, V)
    lp = d.log_prob(x)
    assert lp.shape == (5, 3) and lp.dtype == torch.float64
    torch.testing.assert_close(lp, pyro_log_prob(alpha.expand_as(x), x), rtol=1e-11, atol=1e-11)
    # a value broadcasting against the batch: one count vector scored under 3 alphas
    one = x[0, 0]
    torch.testing.assert_close(DirichletMultinomial(None, alpha).log_prob(one),
                               pyro_log_prob(alpha, one.expand(3, V)), rtol=1e-11, atol=1e-11)


def test_log_prob_shared_alpha_and_float32():
    V = 9
    alpha = rand_alpha(V)
    x = DirichletMultinomial(25, alpha).sample((40,))
    ref = pyro_log_prob(alpha, x)
    d64 = DirichletMultinomial(25, alpha)
    torch.testing.assert_close(d64.log_prob(x), ref, rtol=1e-11, atol=1e-11)
    d32 = DirichletMultinomial(25, alpha.float())
    lp32 = d32.log_prob(x.float())
    assert lp32.dtype == torch.float32
    torch.testing.assert_close(lp32.double(), ref, rtol=1e-5, atol=1e-4)


def test_log_concentration_parametrization_and_gradient():
    V = 6
    la = torch.randn(V, dtype=torch.float64, requires_grad=True)
    x = DirichletMultinomial(30, la.detach().exp()).sample((20,))
    lp = DirichletMultinomial(None, log_concentration=la).log_prob(x).sum()
    (g,) = torch.autograd.grad(lp, la)
    la2 = la.detach().clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(pyro_log_prob(la2.exp(), x).sum(), la2)
    torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-9)
    # gradient through `concentration` too
    a = la.detach().exp().requires_grad_(True)
    (ga,) = torch.autograd.grad(DirichletMultinomial(None, a).log_prob(x).sum(), a)
    torch.testing.assert_close(ga * a.detach(), g_ref, rtol=1e-9, atol=1e-9)


def test_mean_variance_match_scipy():
    V = int(torch.randint(2, 10, ()).item())
    n = int(torch.randint(1, 100, ()).item())
    alpha = rand_alpha(V)
    d = DirichletMultinomial(n, alpha)
    ref = scipy.stats.dirichlet_multinomial(alpha.numpy(), n)
    np.testing.assert_allclose(d.mean.numpy(), ref.mean(), rtol=1e-12)
    np.testing.assert_allclose(d.variance.numpy(), ref.var(), rtol=1e-12)
    # per-row totals: moments broadcast over the batch
    db = DirichletMultinomial(torch.tensor([3.0, 50.0], dtype=torch.float64), alpha)
    assert db.mean.shape == (2, V)
    np.testing.assert_allclose(db.variance[1].numpy(),
                               scipy.stats.dirichlet_multinomial(alpha.numpy(), 50).var(),
                               rtol=1e-12)


def assert_moments(x, mean, cov, k=6.0):
    """Draws ``x`` (S, ..., V) against the true ``mean`` (..., V) and
    covariance ``cov`` (..., V, V): the sample mean of each category within
    ``k`` standard errors sqrt(var / S), and each entry of the sample
    covariance (centred on the true mean, so unbiased) within ``k`` standard
    errors of the mean of the centred products."""
    S = x.shape[0]
    x = x.double()
    se_mean = (torch.diagonal(cov, dim1=-2, dim2=-1) / S).sqrt()
    err = (x.mean(0) - mean).abs()
    assert bool((err <= k * se_mean + 1e-9).all()), (x.mean(0), mean)
    c = x - mean
    prod = c.unsqueeze(-1) * c.unsqueeze(-2)
    # The standard error estimated from the draws, floored by its Gaussian
    # value from the true covariance: a rare category may not appear in S
    # draws, and its centred products then have no spread to estimate from.
    var = torch.diagonal(cov, dim1=-2, dim2=-1)
    gaussian = (var.unsqueeze(-1) * var.unsqueeze(-2) + cov ** 2).sqrt()
    se_cov = torch.maximum(prod.std(0), gaussian) / S ** 0.5
    err = (prod.mean(0) - cov).abs()
    assert bool((err <= k * se_cov + 1e-9).all()), (prod.mean(0), cov)


@pytest.mark.parametrize("method", ["categorical", "binomial"])
def test_sample_moments(method, monkeypatch):
    """Sample mean and covariance of S draws per category (a batch of two
    concentrations with their own totals) against mean and
    covariance_matrix; every draw's total exact."""
    if method == "binomial":
        monkeypatch.setattr(dmod, "_CATEGORICAL_DRAW_LIMIT", 0)
    S, V = 20000, 4
    alpha = rand_alpha(2, V) + 0.3
    totals = torch.stack([torch.randint(5, 20, ()), torch.randint(30, 80, ())]).double()
    d = DirichletMultinomial(totals, alpha)
    x = d.sample((S,))
    assert x.shape == (S, 2, V)
    assert torch.equal(x.sum(-1), totals.expand(S, 2)) and bool((x >= 0).all())
    assert_moments(x, d.mean, d.covariance_matrix)


@pytest.mark.parametrize("method", ["categorical", "binomial"])
def test_sample_varying_totals(method, monkeypatch):
    """Rows with different totals: the multinomial step alone (shared
    probabilities p: mean N p, covariance N (diag(p) - p p^T)) and the
    distribution's sampler, per total, against the moments; totals exact."""
    V, S = 5, 4000
    group_totals = torch.stack([torch.tensor(0), torch.tensor(1), torch.randint(2, 20, ()),
                                torch.randint(100, 300, ())])
    G = len(group_totals)
    totals = group_totals.repeat_interleave(S)
    p = torch.distributions.Dirichlet(rand_alpha(V) + 0.5).sample()
    x = dmod._multinomial_counts(p.expand(G * S, V), totals, method=method)
    assert x.dtype == torch.int64
    assert torch.equal(x.sum(-1), totals) and bool((x >= 0).all())
    N = group_totals.double()[:, None, None]
    assert_moments(x.reshape(G, S, V).transpose(0, 1), N[..., 0] * p,
                   N * (torch.diag(p) - torch.outer(p, p)))

    alpha = rand_alpha(V) + 0.3
    d = DirichletMultinomial(group_totals, alpha, validate_args=True)
    if method == "binomial":
        monkeypatch.setattr(dmod, "_CATEGORICAL_DRAW_LIMIT", 0)
    s = d.sample((S,))
    assert s.shape == (S, G, V)
    assert torch.equal(s.sum(-1), group_totals.double().expand(S, G))
    assert bool(d.support.check(s).all())
    assert_moments(s, d.mean, d.covariance_matrix)
    # per-row total tensor from a batch of alphas
    d2 = DirichletMultinomial(torch.tensor([[1], [100]]), rand_alpha(2, 3, V))
    assert d2.batch_shape == (2, 3)
    assert torch.equal(d2.sample().sum(-1), torch.tensor([[1.0] * 3, [100.0] * 3],
                                                         dtype=torch.float64))


def test_sample_tiny_concentration_is_finite():
    d = DirichletMultinomial(10, torch.full((5,), 1e-6, dtype=torch.float64))
    x = d.sample((200,))
    assert bool(torch.isfinite(x).all()) and bool((x.sum(-1) == 10).all())


def test_support_constraint():
    c = MultinomialCounts(torch.tensor(4.0))
    v = torch.tensor([[1.0, 3.0], [2.0, 1.0], [-1.0, 5.0], [1.5, 2.5], [0.0, 4.0]])
    assert c.check(v).tolist() == [True, False, False, False, True]
    assert MultinomialCounts(None).check(v).tolist() == [True, True, False, False, True]
    assert c.is_discrete and c.event_dim == 1


def test_validation_errors():
    alpha = rand_alpha(3)
    d = DirichletMultinomial(5, alpha, validate_args=True)
    for bad in ([1.0, 1.0, 1.0], [6.0, -1.0, 0.0], [2.5, 2.5, 0.0]):
        with pytest.raises(ValueError):
            d.log_prob(torch.tensor(bad, dtype=torch.float64))
    with pytest.raises(ValueError):
        DirichletMultinomial(5, torch.tensor([1.0, -1.0]), validate_args=True)
    with pytest.raises(ValueError):
        DirichletMultinomial(-2, alpha, validate_args=True)
    with pytest.raises(ValueError):
        DirichletMultinomial(2.5, alpha, validate_args=True)
    with pytest.raises(ValueError, match="exactly one"):
        DirichletMultinomial(5)
    with pytest.raises(ValueError, match="does not broadcast"):
        DirichletMultinomial(torch.tensor([1, 2, 3]), rand_alpha(2, 3))
    # without validation, the pmf of a value with a different total is still computed
    d_nv = DirichletMultinomial(5, alpha, validate_args=False)
    assert torch.isfinite(d_nv.log_prob(torch.tensor([1.0, 1.0, 1.0])))


def test_total_count_none_is_log_prob_only():
    alpha = rand_alpha(4)
    d = DirichletMultinomial(None, alpha, validate_args=True)
    x = torch.tensor([[1.0, 0.0, 2.0, 3.0], [0.0, 0.0, 0.0, 9.0]], dtype=torch.float64)
    torch.testing.assert_close(d.log_prob(x), pyro_log_prob(alpha, x))
    for what in ("sample", "mean", "variance"):
        with pytest.raises(ValueError, match="total_count"):
            d.sample() if what == "sample" else getattr(d, what)


def test_expand():
    alpha = rand_alpha(4)
    d = DirichletMultinomial(12, alpha, validate_args=True)
    e = d.expand((2, 3))
    assert e.batch_shape == (2, 3) and e.event_shape == (4,)
    assert e.sample().shape == (2, 3, 4)
    x = d.sample((2, 3))
    torch.testing.assert_close(e.log_prob(x), d.log_prob(x))
    torch.testing.assert_close(e.mean, d.mean.expand(2, 3, 4))
    el = DirichletMultinomial(None, log_concentration=alpha.log()).expand((5,))
    assert el.batch_shape == (5,)
    torch.testing.assert_close(el.log_prob(x[0, 0]), pyro_log_prob(alpha, x[0, 0]).expand(5))


def test_log_prob_batch_from_total_count():
    """A batch that comes from total_count alone: log_prob's shape is
    broadcast(value.shape[:-1], batch_shape), as for torch's Binomial."""
    V = 3
    alpha = rand_alpha(V)
    d = DirichletMultinomial(torch.full((3,), 6.0, dtype=torch.float64), alpha,
                             validate_args=True)
    assert d.batch_shape == (3,)
    one = d.sample()[0]
    torch.testing.assert_close(d.log_prob(one), pyro_log_prob(alpha, one).expand(3),
                               rtol=1e-11, atol=1e-11)
    x = d.sample((5,))[:, :1]                                # (5, 1, V)
    lp = d.log_prob(x)
    assert lp.shape == (5, 3)
    torch.testing.assert_close(lp, pyro_log_prob(alpha, x).expand(5, 3), rtol=1e-11, atol=1e-11)
    binom = torch.distributions.Binomial(torch.full((3,), 6.0), torch.tensor(0.3))
    assert binom.log_prob(torch.ones(5, 1)).shape == lp.shape
    # still rejected: a value whose total is not total_count
    with pytest.raises(ValueError):
        d.log_prob(torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64))
    for validate in (True, False):
        with pytest.raises(ValueError, match="broadcast"):
            DirichletMultinomial(None, rand_alpha(3, V),
                                 validate_args=validate).log_prob(torch.ones(2, V))


def test_log_prob_broadcasting_matches_scipy():
    """scipy's broadcasting case: alpha (4, 3), n (3, 1), x (2, 1, 1, 3)
    give (2, 3, 4). Where x's total is n, scipy's logpmf; elsewhere (no
    validation) the pmf at x's own total."""
    alpha = rand_alpha(4, 3)
    n = torch.randint(3, 9, (3, 1)).double()
    x = torch.stack([d.sample() for d in (DirichletMultinomial(n[0, 0], alpha[0]),
                                          DirichletMultinomial(n[1, 0], alpha[1]))])
    x = x.reshape(2, 1, 1, 3)
    d = DirichletMultinomial(n, alpha, validate_args=False)
    assert d.batch_shape == (3, 4)
    lp = d.log_prob(x)
    assert lp.shape == (2, 3, 4)
    dm = scipy.stats.dirichlet_multinomial
    for i in range(2):
        xi = x[i].reshape(3).numpy()
        for j in range(3):
            for k in range(4):
                ref = dm.logpmf(xi, alpha[k].numpy(), xi.sum())
                np.testing.assert_allclose(lp[i, j, k].item(), ref, rtol=1e-10, atol=1e-10)
                if xi.sum() == n[j, 0].item():
                    np.testing.assert_allclose(lp[i, j, k].item(),
                                               dm.logpmf(xi, alpha[k].numpy(), int(n[j, 0])),
                                               rtol=1e-10, atol=1e-10)
    # the same through the per-row way: concentration of the full batch shape
    full = DirichletMultinomial(n.expand(3, 4), alpha.expand(3, 4, 3).clone(),
                                validate_args=False)
    torch.testing.assert_close(full.log_prob(x), lp, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value_shape,alpha_shape,total_shape", [
    ((7,), (7,), ()), ((5, 7), (7,), ()), ((7,), (3, 7), ()), ((5, 1, 7), (3, 7), ()),
    ((5, 1, 7), (7,), (3,)), ((2, 1, 1, 7), (4, 7), (3, 1)), ((4, 7), (2, 1, 7), (4,)),
])
def test_log_prob_shapes_and_values(value_shape, alpha_shape, total_shape, device):
    """Shapes of torch/Pyro's broadcasting cases: sample_shape + batch_shape,
    against the float64 formula on explicitly broadcast inputs."""
    V = 7
    alpha = rand_alpha(*alpha_shape, device=device)
    totals = torch.randint(1, 30, total_shape, device=device).double()
    d = DirichletMultinomial(totals, alpha, validate_args=False)
    x = torch.randint(0, 9, value_shape, device=device).double()
    shape = torch.broadcast_shapes(value_shape[:-1], d.batch_shape)
    lp = d.log_prob(x)
    assert lp.shape == shape and lp.device == x.device
    ref = pyro_log_prob(alpha.expand(shape + (V,)), x.expand(shape + (V,)))
    torch.testing.assert_close(lp, ref, rtol=1e-11, atol=1e-11)
    # expanded (stride-0) concentrations agree
    e = d.expand(torch.Size((6,)) + shape)
    torch.testing.assert_close(e.log_prob(x), ref.expand((6,) + shape), rtol=1e-11, atol=1e-11)
    # float32 concentrations, float32 values
    d32 = DirichletMultinomial(totals.float(), alpha.float(), validate_args=False)
    lp32 = d32.log_prob(x.float())
    assert lp32.dtype == torch.float32 and lp32.shape == shape
    torch.testing.assert_close(lp32.double(), ref, rtol=1e-5, atol=1e-4)


def test_log_prob_shared_concentration_takes_shared_way(monkeypatch):
    """A concentration shared by the whole batch (a batch from total_count
    or from expand) reaches log_lik as one (V,) vector, once per distinct
    value row (See Note [Broadcast concentration])."""
    calls = []

    def spy(counts, log_alpha, **kw):
        calls.append((tuple(counts.shape), tuple(log_alpha.shape)))
        return dirmult_ext.log_lik(counts, log_alpha, **kw)

    monkeypatch.setattr(dmod, "log_lik", spy)
    V = 4
    alpha = rand_alpha(V)
    x = torch.randint(0, 9, (5, 1, V)).double()
    d = DirichletMultinomial(torch.full((3,), 7.0), alpha, validate_args=False)
    assert d.log_prob(x).shape == (5, 3)
    assert d.expand((2, 3)).log_prob(x.unsqueeze(1)).shape == (5, 2, 3)
    dl = DirichletMultinomial(None, log_concentration=alpha.log()).expand((8,))
    assert dl.log_prob(x[0, 0]).shape == (8,)
    da = DirichletMultinomial(None, alpha.expand(8, V))        # expanded by the caller
    assert da.log_prob(x[0, 0]).shape == (8,)
    assert calls == [((5, 1, V), (V,)), ((5, 1, 1, V), (V,)), ((V,), (V,)), ((V,), (V,))]
    # a concentration per batch row: one row per (value, concentration) pair
    calls.clear()
    db = DirichletMultinomial(None, rand_alpha(3, V)).expand((2, 3))
    assert db.log_prob(x.unsqueeze(1)).shape == (5, 2, 3)
    assert calls == [((5, 1, 3, V), (5, 1, 3, V))]


def test_log_prob_expanded_gradient():
    """Gradient through an expanded shared concentration equals the
    gradient of the summed formula."""
    V = 5
    la = torch.randn(V, dtype=torch.float64, requires_grad=True)
    d = DirichletMultinomial(torch.full((4,), 10.0, dtype=torch.float64),
                             log_concentration=la).expand((3, 4))
    x = d.sample((2,))
    (g,) = torch.autograd.grad(d.log_prob(x).sum(), la)
    la2 = la.detach().clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(pyro_log_prob(la2.exp().expand_as(x), x).sum(), la2)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


def test_covariance_matches_scipy():
    """scipy's cov, including its broadcasting case (alpha (4, V), n (3, 1)
    give (3, 4, V, V)); mean and variance consistent with it."""
    V = int(torch.randint(2, 8, ()).item())
    alpha = rand_alpha(4, V)
    n = torch.randint(0, 60, (3, 1)).double()
    d = DirichletMultinomial(n, alpha)
    cov = d.covariance_matrix
    assert cov.shape == (3, 4, V, V)
    ref = scipy.stats.dirichlet_multinomial.cov(alpha.numpy(), n.numpy())
    np.testing.assert_allclose(cov.numpy(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.diagonal(cov, dim1=-2, dim2=-1), d.variance,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d.mean.numpy(),
                               scipy.stats.dirichlet_multinomial.mean(alpha.numpy(), n.numpy()),
                               rtol=1e-12)
    # the counts' total is fixed: each row of the covariance sums to 0
    torch.testing.assert_close(cov.sum(-1), torch.zeros(3, 4, V, dtype=torch.float64),
                               rtol=0, atol=1e-9 * float(n.max() ** 2 + 1))
    with pytest.raises(ValueError, match="total_count"):
        DirichletMultinomial(None, alpha).covariance_matrix


def test_covariance_monte_carlo():
    """covariance_matrix against the sample covariance of the distribution's
    own sampler (fixed S draws, standard errors from the draws)."""
    V = 4
    alpha = rand_alpha(3, V) + 0.2
    d = DirichletMultinomial(torch.randint(1, 50, (3,)), alpha)
    assert_moments(d.sample((20000,)), d.mean, d.covariance_matrix)


def test_not_implemented_messages():
    d = DirichletMultinomial(5, rand_alpha(3))
    value = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)
    for call, why in [(lambda: d.rsample(), "discrete"), (lambda: d.entropy(), "closed form"),
                      (lambda: d.enumerate_support(), "support"),
                      (lambda: d.cdf(value), "order"), (lambda: d.icdf(value), "order")]:
        with pytest.raises(NotImplementedError, match=f"DirichletMultinomial.*{why}"):
            call()


def test_pyro_is_optional():
    """``import dirmult_ext`` does not import Pyro; without Pyro,
    ``dirmult_ext.pyro`` raises an ImportError naming pyro-ppl."""
    import subprocess
    import sys
    code = (
        "import sys\n"
        "import dirmult_ext\n"
        "assert 'pyro' not in sys.modules, 'import dirmult_ext imported pyro'\n"
        "sys.modules['pyro'] = None\n"
        "for get in (lambda: dirmult_ext.pyro, lambda: __import__('dirmult_ext.integrations.pyro')):\n"
        "    try:\n"
        "        get()\n"
        "    except ImportError as e:\n"
        "        assert 'pip install pyro-ppl' in str(e), str(e)\n"
        "    else:\n"
        "        raise AssertionError('dirmult_ext.pyro imported without pyro')\n"
        "try:\n"
        "    dirmult_ext.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
