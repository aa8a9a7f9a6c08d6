"""Maximum-likelihood DM fitting (dirmult_ext.fit): recovery of known
concentrations, agreement with an independent optimizer and between the
Newton and fixed-point methods, streaming, weights, and input errors."""
import math

import numpy as np
import pytest
import scipy.optimize
import torch

import dirmult_ext
from dirmult_ext import reference_log_lik
from dirmult_ext.likelihood.distribution import DirichletMultinomial
from dirmult_ext import DMFit, fit

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS else [])


def sample(alpha, B, lo=20, hi=120):
    totals = torch.randint(lo, hi, (B,))
    return DirichletMultinomial(totals, alpha).sample().to(torch.float32)


def total_log_lik(counts, log_alpha):
    """Float64 reference (normalized), plain torch."""
    return float(reference_log_lik(counts.double(), log_alpha.double(), normalize=True).sum())


def test_recovery_of_known_alpha():
    """4000 rows, totals 50..149, V = 10, alpha 0.2..4, a fixed seed: the
    largest relative error of the fitted alpha was 0.013 and the precision's
    0.004; tolerances 0.05 (typical seeds give 0.02-0.07) and 0.02."""
    torch.manual_seed(1234)
    alpha = torch.linspace(0.2, 4.0, 10, dtype=torch.float64)
    x = sample(alpha, 4000, 50, 150)
    r = fit(x)
    assert isinstance(r, DMFit) and r.converged and r.method == "newton"
    assert r.alpha.shape == (10,) and r.alpha.dtype == torch.float64
    rel = ((r.alpha - alpha) / alpha).abs().max().item()
    assert rel < 0.05, rel
    assert abs(r.precision / float(alpha.sum()) - 1) < 0.02
    torch.testing.assert_close(r.log_alpha.exp(), r.alpha)
    assert r.n_rows == 4000


def test_matches_independent_optimizer():
    """L-BFGS-B on the float64 lgamma formula reaches the same optimum."""
    V = int(torch.randint(3, 8, ()).item())
    alpha = torch.rand(V, dtype=torch.float64) * 3 + 0.2
    x = sample(alpha, 500)
    r = fit(x)
    xd = x.double()

    def f(la):
        t = torch.tensor(la, dtype=torch.float64, requires_grad=True)
        v = -reference_log_lik(xd, t, normalize=True).sum()
        (g,) = torch.autograd.grad(v, t)
        return float(v.detach()), g.numpy()

    res = scipy.optimize.minimize(f, np.log(alpha.numpy()), jac=True, method="L-BFGS-B",
                                  options=dict(maxiter=2000, ftol=1e-15, gtol=1e-10))
    assert r.log_lik >= -res.fun - 1e-6 * abs(res.fun)
    np.testing.assert_allclose(r.log_alpha.numpy(), res.x, atol=2e-3)
    # our reported log-likelihood is the normalized total at our alpha
    assert math.isclose(r.log_lik, total_log_lik(x, r.log_alpha), rel_tol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_vanishes_at_optimum(device):
    V = 12
    alpha = torch.rand(V, dtype=torch.float64) * 2 + 0.1
    x = sample(alpha, 800).to(device)
    r = fit(x)
    la = r.log_alpha.clone().requires_grad_(True)
    L = reference_log_lik(x.cpu().double(), la, normalize=True).sum()
    (g,) = torch.autograd.grad(L, la)
    assert g.abs().max().item() / x.shape[0] < 1e-6
    assert r.grad_norm < 1e-6


def test_newton_and_fixed_point_agree_and_increase():
    alpha = torch.rand(8, dtype=torch.float64) * 2 + 0.3
    x = sample(alpha, 1000)
    rn = fit(x, method="newton")
    rf = fit(x, method="fixed_point", max_iter=5000)
    assert rn.converged and rf.converged
    assert rf.method == "fixed_point" and rf.n_iter > rn.n_iter
    assert math.isclose(rn.log_lik, rf.log_lik, rel_tol=1e-8)
    torch.testing.assert_close(rn.alpha, rf.alpha, rtol=1e-3, atol=0)
    for r in (rn, rf):
        t = np.asarray(r.log_lik_trace)
        assert len(t) == r.n_iter + 1
        assert np.all(np.diff(t) >= -1e-9 * abs(t[-1])), t


def test_optimum_beats_perturbations():
    alpha = torch.rand(6, dtype=torch.float64) * 3 + 0.1
    x = sample(alpha, 300)
    r = fit(x)
    best = total_log_lik(x, r.log_alpha)
    for _ in range(10):
        assert total_log_lik(x, r.log_alpha + 0.01 * torch.randn(6, dtype=torch.float64)) < best


@pytest.mark.parametrize("device", DEVICES)
def test_streaming_batches_equal_full(device):
    alpha = torch.rand(15, dtype=torch.float64) + 0.2
    x = sample(alpha, 1037)                         # stays on the CPU, batches move
    full = fit(x, device=device)
    streamed = fit(x, batch_size=100, device=device)
    assert math.isclose(full.log_lik, streamed.log_lik, rel_tol=1e-11)
    torch.testing.assert_close(full.alpha, streamed.alpha, rtol=1e-8, atol=0)


def test_integer_weights_equal_repeated_rows():
    alpha = torch.rand(5, dtype=torch.float64) + 0.5
    x = sample(alpha, 200)
    w = torch.randint(0, 4, (200,))
    a = fit(x, weights=w.double())
    b = fit(x.repeat_interleave(w, dim=0))
    assert math.isclose(a.log_lik, b.log_lik, rel_tol=1e-10)
    torch.testing.assert_close(a.alpha, b.alpha, rtol=1e-7, atol=0)


def test_zero_rows_dtypes_and_numpy_input():
    alpha = torch.rand(6, dtype=torch.float64) + 0.5
    x = sample(alpha, 300)
    r = fit(x)
    xz = torch.cat([x, torch.zeros(7, 6)])           # empty rows carry no information
    torch.testing.assert_close(fit(xz).alpha, r.alpha, rtol=1e-9, atol=0)
    torch.testing.assert_close(fit(x.to(torch.int64)).alpha, r.alpha, rtol=1e-9, atol=0)
    torch.testing.assert_close(fit(x.double().numpy()).alpha, r.alpha, rtol=1e-9, atol=0)
    # an explicit starting point reaches the same optimum
    torch.testing.assert_close(fit(x, init=torch.ones(6)).alpha, r.alpha, rtol=1e-5, atol=0)


def test_unobserved_category():
    alpha = torch.tensor([0.5, 1.0, 2.0, 0.7], dtype=torch.float64)
    x = sample(alpha, 400)
    x[:, 0] = 0
    r = fit(x)
    assert r.converged
    assert r.alpha[0] < 1e-4 * r.alpha[1:].min()
    assert bool(torch.isfinite(r.log_alpha).all())
    # the rest matches a fit without that column (alpha_0 -> 0 is that model)
    r3 = fit(x[:, 1:])
    torch.testing.assert_close(r.alpha[1:], r3.alpha, rtol=1e-3, atol=0)


def test_distribution_of_result_and_progress(capsys):
    alpha = torch.rand(4, dtype=torch.float64) + 0.5
    x = sample(alpha, 100)
    r = fit(x, progress=True)
    err = capsys.readouterr().err
    assert "fit" in err                               # the tqdm bar was drawn
    d = r.distribution()
    assert math.isclose(float(d.log_prob(x.double()).sum()), r.log_lik, rel_tol=1e-10)


def test_input_errors():
    x = sample(torch.ones(3, dtype=torch.float64), 20)
    with pytest.raises(ValueError, match="matrix"):
        fit(x[0])
    with pytest.raises(ValueError, match="2 categories"):
        fit(x[:, :1])
    bad = x.clone()
    bad[0, 0] = -1
    with pytest.raises(ValueError, match="non-negative"):
        fit(bad)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        fit(bad)
    with pytest.raises(ValueError, match="weights"):
        fit(x, weights=torch.ones(19))
    with pytest.raises(ValueError, match="weights"):
        fit(x, weights=-torch.ones(20))
    with pytest.raises(ValueError, match="method"):
        fit(x, method="bfgs")
    with pytest.raises(ValueError, match="init"):
        fit(x, init=torch.ones(4))
    with pytest.raises(ValueError, match="init"):
        fit(x, init=torch.zeros(3))
    with pytest.raises(ValueError, match="batch_size"):
        fit(x, batch_size=0)
    with pytest.raises(ValueError, match="zero total weight"):
        fit(torch.zeros(5, 3))
    with pytest.raises(TypeError):
        fit([[1, 2], [3, 4]])


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs a CUDA device and the package's CUDA kernels")
def test_cuda_fit_matches_cpu():
    alpha = torch.rand(20, dtype=torch.float64) + 0.2
    x = sample(alpha, 3000)
    ref = fit(x)
    for kw in (dict(), dict(batch_size=512)):
        r = fit(x.cuda(), **kw) if not kw else fit(x, device="cuda", **kw)
        assert r.alpha.device.type == "cpu"
        assert math.isclose(r.log_lik, ref.log_lik, rel_tol=1e-10)
        torch.testing.assert_close(r.alpha, ref.alpha, rtol=1e-7, atol=0)
