"""DM regression's standard errors: the observed information, exact up to
``MAX_EXACT_SE_PARAMS`` coefficients, by conjugate gradients on
Hessian-vector products above (See Note [Regression standard errors]).
"""
from __future__ import annotations

import warnings
from typing import List

import numpy as np
import torch
from torch import Tensor

from .data import INTERCEPT, Reducer, RegressionData, augment, dm_row_terms
from .optim import Problem


#: Largest number of coefficients ((P + 1) V with a bias) whose exact
#: Hessian is built for the standard errors ((P+1)V squared float64: 72 MB
#: at 3000). Above it, only the covariates in ``se_for`` get SEs, by CG.
MAX_EXACT_SE_PARAMS = 3000

_CG_TOL = 1e-10      # relative residual of the CG solves for the SEs
_CG_MAX_ITER = 1000


def information(data: RegressionData, Theta: Tensor, has_bias: bool, reduce: Reducer) -> Tensor:
    """Observed information -d^2 L (standardized coordinates), (P'V, P'V)
    for Theta (P', V) = [W_s; bias_s]."""
    Pa, V = Theta.shape
    n = Pa * V
    dev = Theta.device
    I = torch.zeros(n, n, dtype=torch.float64, device=dev)
    Idiag = torch.zeros(Pa, Pa, V, dtype=torch.float64, device=dev)
    chunk = max(1, (1 << 22) // max(n, 1))
    for _, cb, xb, wb in data.batches():
        xa = augment(xb, has_bias)
        for s in range(0, xa.shape[0], chunk):
            x = xa[s:s + chunk]
            w = None if wb is None else wb[s:s + chunk]
            a, d, c = dm_row_terms(cb[s:s + chunk], x @ Theta)
            xw = x if w is None else x * w.unsqueeze(-1)
            Idiag -= torch.einsum("bp,bq,bv->pqv", xw, x, d)
            # c >= 0 (trigamma decreases): the rank-one terms as one Gram matrix
            # Y^T Y, under half the time of the general product (PERFORMANCE_LEDGER.md)
            cw = c if w is None else c * w
            Y = (x.unsqueeze(-1) * (a * cw.sqrt().unsqueeze(-1)).unsqueeze(1)).reshape(
                x.shape[0], n)
            I -= Y.T @ Y
    I.view(Pa, V, Pa, V).diagonal(dim1=1, dim2=3).add_(Idiag)
    return reduce(I)


def _penalty_hessian(prob: Problem, Ws: Tensor, active: Tensor) -> Tensor:
    """The penalty's Hessian in standardized coordinates on the total scale,
    (P, V, P, V) blocks as a (P, V, V) per-row array (the penalties are
    separable by row)."""
    P, V = Ws.shape
    out = torch.zeros(P, V, V, dtype=torch.float64, device=Ws.device)
    if prob.lam == 0 or prob.penalty is None:
        return out
    eye = torch.eye(V, dtype=torch.float64, device=Ws.device)
    s = prob.data.scale
    if prob.penalty == "l2":
        return (prob.lam / s.pow(2)).view(P, 1, 1) * eye
    nrm = Ws.norm(dim=1).clamp_min(1e-300)
    u = Ws / nrm.unsqueeze(-1)
    h = (prob.lam / s / nrm).view(P, 1, 1) * (eye - u.unsqueeze(-1) * u.unsqueeze(1))
    return torch.where(active.view(P, 1, 1), h, torch.zeros_like(h))


def standardized_to_original(P: int, has_bias: bool, mu: Tensor, scale: Tensor) -> Tensor:
    """T0 (P', P'): original coefficients (per category) = T0 @ standardized:
    W[p] = W_s[p] / s_p, bias = bias_s - sum_p mu_p W_s[p] / s_p."""
    Pa = P + int(has_bias)
    T0 = torch.zeros(Pa, Pa, dtype=torch.float64, device=scale.device)
    T0[range(P), range(P)] = 1 / scale
    if has_bias:
        T0[P, :P] = -mu / scale
        T0[P, P] = 1.0
    return T0


def exact_cov(data, prob, Ws, bs, has_bias, active_rows, T0, reduce):
    """Covariance of the original coefficients ((P'V)^2) from the exact
    information, or None (with a warning) when it is not positive definite."""
    P, V = Ws.shape
    Theta = Ws if bs is None else torch.cat([Ws, bs.unsqueeze(0)])
    Pa = Theta.shape[0]
    I = information(data, Theta, has_bias, reduce)
    I4 = I.view(Pa, V, Pa, V)
    ph = _penalty_hessian(prob, Ws, active_rows)
    for p in range(P):
        I4[p, :, p, :] += ph[p]
    keep_rows = torch.cat([active_rows, torch.ones(Pa - P, dtype=torch.bool,
                                                   device=Ws.device)])
    keep = keep_rows.repeat_interleave(V)
    Ik = I[keep][:, keep]
    L, info = torch.linalg.cholesky_ex(Ik)
    if int(info) != 0:
        warnings.warn("fit_regression: the observed information is not positive definite "
                      "at the estimate (collinear covariates, a category never observed, "
                      "counts without overdispersion, or not converged): standard errors "
                      "not computed", RuntimeWarning,
                      stacklevel=3)
        return None
    Ck = torch.cholesky_inverse(L)
    C = torch.zeros_like(I)
    idx = keep.nonzero().squeeze(-1)
    C[idx.unsqueeze(-1), idx] = Ck
    C4 = torch.einsum("ap,pvqw,bq->avbw", T0, C.view(Pa, V, Pa, V), T0)
    return C4.reshape(Pa * V, Pa * V)


def cg_variances(data, prob, Ws, bs, has_bias, rows_req: List[int], T0, reduce,
                  active_rows) -> Tensor:
    """Variances of the original coefficients of the requested rows of
    Theta (P' rows, the last one the bias), (len, V), by preconditioned CG
    on information-vector products. NaN where CG meets negative curvature
    or does not converge."""
    P, V = Ws.shape
    Theta = Ws if bs is None else torch.cat([Ws, bs.unsqueeze(0)])
    Pa = Theta.shape[0]
    dev = Ws.device
    ph = _penalty_hessian(prob, Ws, active_rows)        # (P, V, V)
    terms = {}

    def row_terms(i, cb, xa):
        if i in terms:
            return terms[i]
        t = dm_row_terms(cb, xa @ Theta)
        if not data.streaming:
            terms[i] = t
        return t

    # Jacobi preconditioner: diag of the information
    dg = torch.zeros(Pa, V, dtype=torch.float64, device=dev)
    for i, cb, xb, wb in data.batches():
        xa = augment(xb, has_bias)
        a, d, c = row_terms(i, cb, xa)
        xw = xa * xa if wb is None else xa * xa * wb.unsqueeze(-1)
        dg -= xw.T @ (d + c.unsqueeze(-1) * a * a)
    dg = reduce(dg)
    dg[:P] += ph.diagonal(dim1=1, dim2=2)
    dg = torch.where(dg > 0, dg, torch.ones_like(dg))

    def apply(Vd):                                      # Vd (Pa, V, k)
        out = torch.zeros_like(Vd)
        for i, cb, xb, wb in data.batches():
            xa = augment(xb, has_bias)
            a, d, c = row_terms(i, cb, xa)
            delta = torch.einsum("bp,pvk->bvk", xa, Vd)
            Hd = d.unsqueeze(-1) * delta + (c.view(-1, 1, 1) * a.unsqueeze(-1)) * \
                (a.unsqueeze(-1) * delta).sum(1, keepdim=True)
            xw = xa if wb is None else xa * wb.unsqueeze(-1)
            out -= torch.einsum("bp,bvk->pvk", xw, Hd)
        out = reduce(out)
        out[:P] += torch.einsum("puv,pvk->puk", ph, Vd[:P])
        return out

    # right-hand sides t_j = T^T e_j for the requested rows' coefficients
    k = len(rows_req) * V
    R = torch.zeros(Pa, V, k, dtype=torch.float64, device=dev)
    j = 0
    for r in rows_req:
        for v in range(V):
            R[:, v, j] = T0[r]
            j += 1
    # inactive group-lasso rows are held at zero: their coordinates leave the system
    mask = torch.cat([active_rows, torch.ones(Pa - P, dtype=torch.bool, device=dev)])
    mask = mask.view(Pa, 1, 1).to(torch.float64)
    R = R * mask
    Z = torch.zeros_like(R)
    res = R.clone()
    Pz = res / dg.unsqueeze(-1) * mask
    p = Pz.clone()
    rz = (res * Pz).sum((0, 1))
    r0 = res.norm(dim=(0, 1)).clamp_min(1e-300)
    ok = torch.ones(k, dtype=torch.bool, device=dev)
    done = res.norm(dim=(0, 1)) <= _CG_TOL * r0
    for _ in range(_CG_MAX_ITER):
        if bool(done.all()):
            break
        Ap = apply(p) * mask
        pAp = (p * Ap).sum((0, 1))
        ok &= (pAp > 0) | done
        step = torch.where(done | (pAp <= 0), torch.zeros_like(pAp), rz / pAp.clamp_min(1e-300))
        Z += step * p
        res -= step * Ap
        Pz = res / dg.unsqueeze(-1) * mask
        rz_new = (res * Pz).sum((0, 1))
        beta = torch.where(done, torch.zeros_like(rz), rz_new / rz.clamp_min(1e-300))
        p = Pz + beta * p
        rz = rz_new
        done |= (res.norm(dim=(0, 1)) <= _CG_TOL * r0) | ~ok
    var = (R * Z).sum((0, 1))
    bad = ~(ok & done)
    if bool(bad.any()):
        warnings.warn(f"fit_regression: conjugate gradients did not converge for "
                      f"{int(bad.sum())} of {k} standard errors (NaN)", RuntimeWarning,
                      stacklevel=3)
    var = torch.where(bad, torch.full_like(var, float("nan")), var)
    return var.view(len(rows_req), V)


def rows_for(se_for, covariate_names: List[str], has_bias: bool) -> List[int]:
    P = len(covariate_names)
    if se_for is None:
        return []
    if isinstance(se_for, (str, int)):
        se_for = [se_for]
    out = []
    for item in se_for:
        if isinstance(item, str) and item in (INTERCEPT, "bias"):
            if not has_bias:
                raise ValueError("se_for names the intercept but the fit has no bias")
            r = P
        elif isinstance(item, str):
            if item not in covariate_names:
                raise ValueError(f"se_for: no covariate named {item!r}")
            r = covariate_names.index(item)
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool) \
                and -P <= int(item) < P:
            r = int(item) % P
        else:
            raise ValueError(f"se_for: {item!r} is neither a covariate name nor an index "
                             f"in [0, {P})")
        if r not in out:
            out.append(r)
    return out


