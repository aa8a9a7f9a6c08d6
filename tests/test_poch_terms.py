"""dirmult::poch_terms, the math of include/dirmult/math.h term by term,
against mpmath, where the naive float32 lgamma formula fails.

Each log-rising-factorial term lnpoch(alpha, n) and each gradient term
alpha * dpoch(alpha, n), computed in float32, must be within 1e-6 relative
of its true value at the float32 inputs (row totals: test_log_lik.py). The
eager float32 formula's error on the same cases is printed for comparison
(pytest -s).
"""
import math

import mpmath
import pytest
import torch

from reference import mp_adpoch, mp_lnpoch

REL_TOL = 1e-6


def _draw_terms(n_pairs, generator):
    """log_alpha uniform on [log 1e-6, log 1e7] (float32); counts: small
    integers, large integers up to 1e7, and non-integers."""
    log_alpha = torch.empty(n_pairs, dtype=torch.float64).uniform_(
        math.log(1e-6), math.log(1e7), generator=generator).float()
    kind = torch.randint(0, 3, (n_pairs,), generator=generator)
    small = torch.randint(1, 20, (n_pairs,), generator=generator).double()
    large = torch.exp(torch.empty(n_pairs, dtype=torch.float64).uniform_(
        math.log(20), math.log(1e7), generator=generator)).round()
    frac = torch.exp(torch.empty(n_pairs, dtype=torch.float64).uniform_(
        math.log(1e-3), math.log(1e6), generator=generator))
    n = torch.where(kind == 0, small, torch.where(kind == 1, large, frac)).float()
    # The edges too: the smallest and largest of each range, the path
    # boundaries, and a zero crossing of lnpoch (a (a + 1) = 1).
    edges = torch.tensor([1e-6, 1e-6, 1e7, 1e7, 1.0, 8.0, 7.999, 8.001, 0.618034], dtype=torch.float64)
    log_alpha = torch.cat([log_alpha, edges.log().float()])
    n = torch.cat([n, torch.tensor([1.0, 1e7, 1.0, 1e7, 1.0, 16.0, 17.0, 0.5, 2.0])])
    return log_alpha, n


def _mp_alpha(log_alpha):
    """The concentration the kernel works with: exp of the float32 input."""
    return mpmath.exp(mpmath.mpf(float(log_alpha)))


def _rel_err(x, ref):
    return abs(float(x) - float(ref)) / max(abs(float(ref)), 1e-300)


def test_terms_match_mpmath(device):
    g = torch.Generator().manual_seed(torch.seed())
    log_alpha, n = _draw_terms(2000, g)
    lnp, adp = torch.ops.dirmult.poch_terms(log_alpha.to(device), n.to(device))
    lnp, adp = lnp.cpu(), adp.cpu()
    # The naive float32 forms, for the record.
    alpha = log_alpha.exp()
    naive_lnp = torch.lgamma(alpha + n) - torch.lgamma(alpha)
    naive_adp = alpha * (torch.digamma(alpha + n) - torch.digamma(alpha))
    worst = {"lnpoch": 0.0, "adpoch": 0.0, "naive lnpoch": 0.0, "naive adpoch": 0.0}
    failures = []
    for i in range(alpha.numel()):
        a = _mp_alpha(log_alpha[i])
        t_l, t_a = mp_lnpoch(a, n[i]), mp_adpoch(a, n[i])
        e_l, e_a = _rel_err(lnp[i], t_l), _rel_err(adp[i], t_a)
        worst["lnpoch"] = max(worst["lnpoch"], e_l)
        worst["adpoch"] = max(worst["adpoch"], e_a)
        worst["naive lnpoch"] = max(worst["naive lnpoch"], _rel_err(naive_lnp[i], t_l))
        worst["naive adpoch"] = max(worst["naive adpoch"], _rel_err(naive_adp[i], t_a))
        if e_l > REL_TOL or e_a > REL_TOL:
            failures.append((float(alpha[i]), float(n[i]), float(lnp[i]), float(t_l),
                             float(adp[i]), float(t_a)))
    print(f"\n[{device}] worst relative error: " +
          ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    assert not failures, f"{len(failures)} terms off by > {REL_TOL}: {failures[:5]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_count_terms_match_mpmath(device, dtype):
    """Integer counts just past the exact products' 16 (17 .. 129: the
    chunked products, a log per 16 factors, up to kMaxChunkedCount for
    lnpoch and kMaxChunkedAdpochCount for adpoch, then the general path)
    over alpha in [1e-6, 1e7], and alpha ~ 1e-14 where log a
    cancels the log of the product: within 1e-6 (float32) or 1e-13 (float64)
    of the true value. (float64 takes no refinement where the terms cancel,
    as in the exact path: there its error is relative to |log a|.)"""
    g = torch.Generator().manual_seed(torch.seed())
    n = torch.arange(17, 130, dtype=torch.float64).repeat(4)
    log_alpha = torch.empty_like(n).uniform_(math.log(1e-6), math.log(1e7), generator=g)
    log_alpha[::37] = math.log(8.0)  # the boundary of the scaled factors
    tiny = torch.tensor([17.0, 18.0, 20.0, 24.0]), torch.tensor([1e-14, 2.8e-14, 1.3e-16, 4e-23])
    n = torch.cat([n, tiny[0]])
    log_alpha = torch.cat([log_alpha, tiny[1].log()]).to(dtype)
    lnp, adp = torch.ops.dirmult.poch_terms(log_alpha.to(device), n.to(dtype).to(device))
    tol = REL_TOL if dtype == torch.float32 else 1e-13
    failures = []
    for i in range(n.numel()):
        a = mpmath.exp(mpmath.mpf(float(log_alpha[i])))
        t_l = mp_lnpoch(a, n[i])
        e_l = _rel_err(lnp[i].cpu(), t_l)
        if dtype == torch.float64:
            e_l *= abs(float(t_l)) / max(abs(float(t_l)), abs(float(log_alpha[i])))
        e_a = _rel_err(adp[i].cpu(), mp_adpoch(a, n[i]))
        if e_l > tol or e_a > tol:
            failures.append((float(log_alpha[i]), float(n[i]), e_l, e_a))
    assert not failures, f"{len(failures)} terms off by > {tol}: {failures[:5]}"


def test_zero_count_terms_are_exactly_zero(device):
    log_alpha = torch.empty(64).uniform_(-14, 16).to(device)
    lnp, adp = torch.ops.dirmult.poch_terms(log_alpha, torch.zeros_like(log_alpha))
    assert torch.all(lnp == 0) and torch.all(adp == 0)


def test_large_alpha_gradient_is_not_lost(device):
    """alpha * (digamma(a+n) - digamma(a)) at a = 1e7, n = 5 is ~5, not 0."""
    log_alpha = torch.tensor([1e7, 1e6, 3e5]).log().to(device)
    n = torch.tensor([5.0, 1.0, 2.0], device=device)
    _, adp = torch.ops.dirmult.poch_terms(log_alpha, n)
    for i in range(3):
        truth = mp_adpoch(_mp_alpha(log_alpha[i].cpu()), n[i].cpu())
        assert _rel_err(adp[i].cpu(), truth) < REL_TOL
