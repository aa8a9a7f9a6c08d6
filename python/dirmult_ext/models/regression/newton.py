"""DM regression by Newton's method with the exact Hessian (the observed
information the standard errors take, See Note [Regression standard
errors]), for no penalty and L2: a few iterations where L-BFGS takes tens,
each one pass over the rows for the value and gradient and one for the
dense Hessian, then a Cholesky solve.

Safeguards: where the Hessian of the objective is not positive definite
(Cholesky fails), a Levenberg shift ``H + mu I`` with mu growing tenfold
until it factors (for large mu a scaled gradient step); a backtracking
(Armijo) line search on the objective; and where that finds no decrease
before the gradient meets ``gtol``, L-BFGS from the point reached for the
iterations left.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .optim import Problem, lbfgs
from .se import information


#: ``method="auto"`` takes Newton for at most this many coefficients
#: (n = (P + 1) V with a bias, P V without; the Cholesky factorization costs
#: n^3 / 3)...
MAX_NEWTON_PARAMS = 1200
#: ... and at most this many for (P + 1) n (P n without a bias): a Newton
#: iteration's Hessian costs n^2 per row against about V (P + const) for a
#: gradient pass, so this bounds its cost in gradient passes; below both
#: Newton's 5-7 iterations beat L-BFGS's 20-60 (PERFORMANCE_LEDGER.md, DM
#: regression fits).
MAX_NEWTON_WORK = 4000

_ARMIJO = 1e-4          # sufficient decrease, as a fraction of the directional derivative
_MIN_STEP = 2.0 ** -30  # backtracking gives up below this step
_MAX_SHIFTS = 14        # Levenberg shifts tried, mu growing tenfold from 1e-10 max|diag|


def _hessian(prob: Problem, Ws: Tensor, bs: Optional[Tensor]) -> Tensor:
    """Hessian of the per-unit-weight objective in standardized coordinates,
    ((P' V), (P' V)), rows of Theta = [W_s; bias_s] flattened."""
    P, V = Ws.shape
    Theta = Ws if bs is None else torch.cat([Ws, bs.unsqueeze(0)])
    H = information(prob.data, Theta, bs is not None, prob.reduce)
    H /= prob.wsum
    if prob.penalty == "l2" and prob.lam > 0:
        r = (prob.lam / prob.wsum) / prob.data.scale.pow(2)
        H.diagonal()[:P * V] += r.repeat_interleave(V)
    return H


def _direction(H: Tensor, g: Tensor) -> Tensor:
    """-(H + mu I)^{-1} g with the least mu in 0, 1e-10 m, 1e-9 m, ... (m the
    largest |diagonal| entry) that makes the matrix positive definite."""
    L, info = torch.linalg.cholesky_ex(H)
    if int(info) == 0:
        return -torch.cholesky_solve(g.unsqueeze(-1), L).squeeze(-1)
    m = float(H.diagonal().abs().max())
    m = m if m > 0 and m == m else 1.0
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    mu = 1e-10 * m
    for _ in range(_MAX_SHIFTS):
        L, info = torch.linalg.cholesky_ex(H + mu * eye)
        if int(info) == 0:
            return -torch.cholesky_solve(g.unsqueeze(-1), L).squeeze(-1)
        mu *= 10
    return -g / mu           # (a NaN Hessian: a short gradient step)


def newton(prob: Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter, bar):
    """Same arguments and returns as :func:`optim.lbfgs` (no group lasso)."""
    P, V = Ws.shape
    has_b = bs is not None
    Ws = Ws.clone()
    bs = None if bs is None else bs.clone()
    f, gW, gb = prob.smooth(Ws, bs)
    trace = [f]
    gnorm = prob.kkt(Ws, gW, gb)
    converged = gnorm == 0.0
    n_iter = 0
    while not converged and n_iter < max_iter:
        n_iter += 1
        g = gW.flatten() if not has_b else torch.cat([gW.flatten(), gb])
        d = _direction(_hessian(prob, Ws, bs), g)
        slope = float(g @ d)
        if not slope < 0:     # (rounding at the optimum): the gradient itself
            d, slope = -g, -float(g @ g)
        dW = d[:P * V].view(P, V)
        db = d[P * V:] if has_b else None
        t, accepted = 1.0, False
        while t >= _MIN_STEP:
            Wn = Ws + t * dW
            bn = None if not has_b else bs + t * db
            fn, gWn, gbn = prob.smooth(Wn, bn)
            # (a few ulps of slack: near the optimum the decrease is below f's rounding)
            if fn <= f + _ARMIJO * t * slope + 1e-14 * abs(f):
                accepted = True
                break
            t *= 0.5
        if not accepted:
            n_iter -= 1
            if gnorm <= gtol:
                converged = True
                break
            # no decrease along the safeguarded direction: L-BFGS for the iterations left
            Ws, bs, tr, it, converged, gnorm = lbfgs(prob, Ws, bs, tol=tol, gtol=gtol,
                                                     max_iter=max_iter - n_iter, bar=bar)
            trace += tr[1:]
            n_iter += it
            break
        Ws, bs, gW, gb = Wn, bn, gWn, gbn
        gnorm = prob.kkt(Ws, gW, gb)
        converged = abs(fn - f) <= tol * max(abs(fn), 1.0) and gnorm <= gtol
        f = fn
        trace.append(f)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(objective=f"{f:.10g}", grad=f"{gnorm:.2g}")
    return Ws, bs, trace, n_iter, converged, gnorm
