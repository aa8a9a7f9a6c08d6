r"""Bioconductor ``DirichletMultinomial::dmn``'s own Laplace value, for
comparison with published dmn results only.

dmn's C ``hessian()`` (``dirichlet_fit_main.c``) builds component k's
Hessian in lambda = log alpha from per-row sums; two of them, over rows b
and categories v,

    sum_b [r_bk > 0 and n_bv > 0 ? psi(alpha_kv + n_bv)  : psi(alpha_kv)]
    sum_b [r_bk > 0 and n_bv > 0 ? psi'(alpha_kv + n_bv) : psi'(alpha_kv)]

are not weighted by the responsibilities r_bk, while every other term is.
The Hessian of the weighted objective the M-step maximizes,
``-[sum_b r_bk log DM(n_b | alpha_k) + log prior]``, weights them all: that
is what :attr:`DMMixture.laplace` uses. The two agree for k = 1 (every r_bk
= 1) and differ for k >= 2; on a 278 x 130 microbiome table, by +0.2 to
-267 for k = 2..7, enough to change the chosen k. Everything else (NLE, the
weights' 2 log B - log W_k terms, BIC, AIC) is the same in both.
"""
from __future__ import annotations

import math

import torch

from .criteria import criteria

__all__ = ["dmn_laplace"]


def dmn_laplace(mixture, counts) -> float:
    """dmn's Laplace value of a fitted mixture (module docstring): a
    compatibility number for reproducing ``DirichletMultinomial::dmn``'s
    ``laplace()`` on the same fit, not a better criterion.

    Args:
        mixture: a :class:`~dirmult_ext.models.mixture.DMMixture` from
            :func:`~dirmult_ext.fit_mixture` (dmn fits with
            ``prior="dmn"``).
        counts: the ``(B, V)`` counts it was fitted to (tensor or numpy
            array), rows in the same order.

    Returns:
        dmn's Laplace, on the scale of ``mixture.laplace``.
    """
    R = mixture.responsibilities.to(torch.float64)
    n = torch.as_tensor(counts).to(device="cpu", dtype=torch.float64)
    if n.dim() != 2 or n.shape != (R.shape[0], mixture.log_alpha.shape[1]):
        raise ValueError(f"counts must be the (B, V) = {(R.shape[0], mixture.log_alpha.shape[1])}"
                         f" matrix the mixture was fitted to, got shape {tuple(n.shape)}")
    eta = mixture.log_alpha.to(torch.float64)
    K, V = eta.shape
    B = n.shape[0]
    alpha = eta.exp()
    A = alpha.sum(-1)
    N = n.sum(-1)
    W = R.sum(0)
    log_det = 0.0
    for k in range(K):
        a, r = alpha[k], R[:, k]
        # dmn's unweighted per-row sums: psi(alpha + n) where r > 0 and n > 0,
        # psi(alpha) elsewhere (n = 0 gives psi(alpha) in both branches)
        x = a + torch.where(r.unsqueeze(-1) > 0, n, torch.zeros_like(n))
        c0 = torch.special.digamma(x).sum(0)
        c1 = torch.special.polygamma(1, x).sum(0)
        a0 = W[k] * torch.special.digamma(a)
        a1 = W[k] * torch.special.polygamma(1, a)
        ck0 = (r * torch.special.digamma(A[k] + N)).sum()
        ck1 = (r * torch.special.polygamma(1, A[k] + N)).sum()
        ak0 = W[k] * torch.special.digamma(A[k])
        ak1 = W[k] * torch.special.polygamma(1, A[k])
        rate = 0.0 if mixture.prior is None else mixture.prior.rate
        # dmn's H: diagonal -a (ak0 - ck0 + c0 - a0) - a^2 (ak1 - ck1 + c1 - a1)
        # + rate a, off-diagonal -a_i a_j (ak1 - ck1); as diag(h) + c a a^T:
        c = -(ak1 - ck1)
        h = -a * (ak0 - ck0 + c0 - a0) - a * a * (c1 - a1) + a * rate
        # its log |det| by the determinant lemma, as the weighted form's
        log_det += float(h.abs().log().sum() + (1 + c * (a * a / h).sum()).abs().log())
        if k > 0:
            log_det += 2 * math.log(B) - float(W[k].log())
    return criteria(mixture.log_lik, mixture.log_prior, log_det, K, V, B)["laplace"]
