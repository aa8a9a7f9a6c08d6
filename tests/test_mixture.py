"""DM mixtures by EM (the classifier: test_classifier.py)."""
import itertools
import math

import numpy as np
import pytest
import torch

import dirmult_ext
from dirmult_ext.likelihood.distribution import DirichletMultinomial
from dirmult_ext import fit
from dirmult_ext.models.mixture import DMMixture, fit_mixture
from dirmult_ext.models.metrics import adjusted_rand_index, best_permutation_accuracy

from reference import separated_mixture

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS else [])



def match(pred, z, K):
    """Best relabeling of predicted components onto labels: (accuracy, perm)
    with perm[predicted] = label."""
    best = (-1.0, None)
    for perm in itertools.permutations(range(K)):
        acc = float((torch.tensor(perm)[pred] == z).double().mean())
        best = max(best, (acc, perm))
    return best


@pytest.mark.parametrize("device", DEVICES)
def test_recovery_of_separated_components(device):
    """Fixed seed. Tolerances: labels recovered with accuracy > 0.95 up to
    permutation (1.0 on typical seeds), adjusted Rand index > 0.9; each
    alpha entry within 40% and each precision A_k within 20% of the truth
    (300 rows per component; typical max entry error 0.13-0.26); weights
    within 0.02 of the label frequencies."""
    K = 3
    x, z, alpha = separated_mixture(seed=7)
    m = fit_mixture(x.to(device), K, seed=3)
    assert isinstance(m, DMMixture) and m.converged
    pred = m.predict(x.to(device)).cpu()
    acc, perm = match(pred, z, K)
    assert acc > 0.95, acc
    assert adjusted_rand_index(pred, z) > 0.9
    inv = [perm.index(k) for k in range(K)]                 # fitted index of label k
    a = m.alpha[inv]
    assert ((a - alpha) / alpha).abs().max().item() < 0.4
    assert ((a.sum(1) - alpha.sum(1)) / alpha.sum(1)).abs().max().item() < 0.2
    freq = torch.bincount(z, minlength=K).double() / len(z)
    assert (m.weights[inv] - freq).abs().max().item() < 0.02


def test_em_properties():
    x, z, _ = separated_mixture(B=300, V=12)
    m = fit_mixture(x, 3, n_init=2, init="random", max_iter=100)
    t = np.asarray(m.log_lik_trace)
    assert np.all(np.diff(t) >= -1e-9 * abs(t[-1])), t          # generalized EM: monotone
    assert len(m.restart_log_liks) == 2 and math.isclose(max(m.restart_log_liks), m.log_lik)
    assert m.log_alpha.shape == (3, 12) and m.weights.shape == (3,)
    assert math.isclose(float(m.weights.sum()), 1.0, rel_tol=1e-12)
    R = m.responsibilities
    assert R.shape == (300, 3)
    torch.testing.assert_close(R.sum(-1), torch.ones(300, dtype=torch.float64))
    torch.testing.assert_close(m.predict_proba(x), R, rtol=1e-5, atol=1e-8)
    assert torch.equal(m.predict(x), m.predict_proba(x).argmax(-1))
    # log_prob of the rows sums to the reported log-likelihood (at convergence)
    assert math.isclose(float(m.log_prob(x).sum()), m.log_lik, rel_tol=1e-5)
    p = 3 * 12 + 2                                  # dmn's scale: half the usual
    assert math.isclose(m.bic, -m.log_lik + 0.5 * p * math.log(300))
    assert math.isclose(m.aic, -m.log_lik + p)


def test_one_component_equals_fit():
    alpha = torch.rand(6, dtype=torch.float64) + 0.3
    x = DirichletMultinomial(torch.randint(10, 60, (400,)), alpha).sample().float()
    m = fit_mixture(x, 1, n_init=1, tol=1e-12, max_iter=100)
    r = fit(x)
    assert math.isclose(m.log_lik, r.log_lik, rel_tol=1e-9)
    torch.testing.assert_close(m.alpha[0], r.alpha, rtol=1e-4, atol=0)


def test_seed_reproducible_and_streaming():
    x, _, _ = separated_mixture(B=240)
    a = fit_mixture(x, 3, n_init=1, seed=11)
    b = fit_mixture(x, 3, n_init=1, seed=11, batch_size=50)
    assert math.isclose(a.log_lik, b.log_lik, rel_tol=1e-9)
    torch.testing.assert_close(a.log_alpha, b.log_alpha, rtol=1e-6, atol=1e-6)


def test_mixture_errors():
    x, _, _ = separated_mixture(B=20)
    with pytest.raises(ValueError, match="k"):
        fit_mixture(x, 0)
    with pytest.raises(ValueError, match="rows"):
        fit_mixture(x[:2], 3)
    with pytest.raises(ValueError, match="init"):
        fit_mixture(x, 2, init="spectral")
    with pytest.raises(ValueError, match="n_init"):
        fit_mixture(x, 2, n_init=0)


def test_adjusted_rand_index():
    assert adjusted_rand_index([0, 0, 1, 1, 2], [5, 5, 3, 3, 9]) == 1.0
    # hand-computed: table [[2,0,0],[0,1,1]] -> (1 - 1/3) / (3/2 - 1/3) = 4/7
    assert math.isclose(adjusted_rand_index([0, 0, 1, 1], [0, 0, 1, 2]), 4 / 7)
    rng = np.random.default_rng()
    assert abs(adjusted_rand_index(rng.integers(0, 3, 3000), rng.integers(0, 3, 3000))) < 0.02
    assert best_permutation_accuracy([1, 1, 0, 0], [0, 0, 1, 1]) == 1.0


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs a CUDA device and the package's CUDA kernels")
def test_cuda_mixture_matches_cpu():
    x, _, _ = separated_mixture(B=600)
    a = fit_mixture(x, 3, n_init=1, seed=5)
    b = fit_mixture(x.cuda(), 3, n_init=1, seed=5)
    assert math.isclose(a.log_lik, b.log_lik, rel_tol=1e-8)
    torch.testing.assert_close(a.log_alpha, b.log_alpha, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.predict(x), b.predict(x.cuda()).cpu())


def test_init_from_responsibilities():
    x, z, _ = separated_mixture(B=300, seed=3)
    cold = fit_mixture(x, 3, n_init=1, n_screen=0, init="random", seed=1, tol=1e-10,
                       max_iter=300)
    assert cold.converged and cold.n_iter > 5
    # from the converged fit's own responsibilities: one run, already at the optimum
    warm = fit_mixture(x, 3, n_init=4, init=cold.responsibilities, tol=1e-10, max_iter=300)
    assert len(warm.restart_log_liks) == 1
    assert warm.n_iter <= 3, warm.n_iter
    assert math.isclose(warm.log_lik, cold.log_lik, rel_tol=1e-9)
    # from the true labels (softened), as a numpy array
    R = 0.9 * np.eye(3)[z.numpy()] + 0.1 / 3
    m = fit_mixture(x, 3, init=R)
    assert adjusted_rand_index(m.predict(x).numpy(), z.numpy()) > 0.95
    with pytest.raises(ValueError, match=r"init responsibilities must have shape \(300, 3\)"):
        fit_mixture(x, 3, init=R[:, :2])
    with pytest.raises(ValueError, match="summing to 1"):
        fit_mixture(x, 3, init=2 * R)
