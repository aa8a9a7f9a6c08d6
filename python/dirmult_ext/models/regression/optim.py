"""DM regression's objective and its optimizers: L-BFGS, and for the group
lasso FISTA phases with L-BFGS on the nonzero rows (See Note [Regression
standard errors] for the Hessian the standard errors take).
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import Tensor

from .data import Reducer, RegressionData, rows_log_lik


class Problem:
    """The objective in standardized coordinates, per unit row weight."""

    def __init__(self, data: RegressionData, has_bias: bool, penalty, lam: float, wsum: float,
                 reduce: Reducer):
        self.data, self.has_bias, self.penalty, self.lam = data, has_bias, penalty, lam
        self.wsum = wsum
        self.reduce = reduce
        self.n_evals = 0

    # smooth part: -L / wsum (+ the L2 penalty)
    def smooth(self, Ws: Tensor, bs: Optional[Tensor]):
        P, V = Ws.shape
        dev = Ws.device
        tot = torch.zeros((), dtype=torch.float64, device=dev)
        gW = torch.zeros_like(Ws)
        gb = torch.zeros(V, dtype=torch.float64, device=dev)
        for _, cb, xb, wb in self.data.batches():
            W_ = Ws.detach().requires_grad_(True)
            b_ = None if bs is None else bs.detach().requires_grad_(True)
            with torch.enable_grad():
                ll = rows_log_lik(cb, xb, W_, b_, False)
                t = ll.sum() if wb is None else (ll * wb).sum()
                grads = torch.autograd.grad(t, [W_] if b_ is None else [W_, b_])
            tot = tot + t.detach()
            gW += grads[0]
            if b_ is not None:
                gb += grads[1]
        flat = self.reduce(torch.cat([tot.reshape(1), gW.flatten(), gb]))
        self.n_evals += 1
        s = -1.0 / self.wsum
        f = flat[0] * s
        gW = flat[1:1 + P * V].view(P, V) * s
        gb = flat[1 + P * V:] * s
        if self.penalty == "l2" and self.lam > 0:
            r = (self.lam / self.wsum) / self.data.scale.pow(2).unsqueeze(-1)
            f = f + 0.5 * (r * Ws * Ws).sum()
            gW = gW + r * Ws
        return float(f), gW, (gb if bs is not None else None)

    def group_weights(self) -> Tensor:
        """Per-row threshold lam / (wsum s_p) of the group penalty in
        standardized coordinates."""
        return (self.lam / self.wsum) / self.data.scale

    def nonsmooth(self, Ws: Tensor) -> float:
        if self.penalty != "group_lasso" or self.lam == 0:
            return 0.0
        return float((self.group_weights() * Ws.norm(dim=1)).sum())

    def prox(self, Ws: Tensor, step: float) -> Tensor:
        if self.penalty != "group_lasso" or self.lam == 0:
            return Ws
        thr = step * self.group_weights()
        nrm = Ws.norm(dim=1)
        shrink = torch.where(nrm > thr, 1 - thr / nrm.clamp_min(1e-300), torch.zeros_like(nrm))
        return Ws * shrink.unsqueeze(-1)

    def kkt(self, Ws: Tensor, gW: Tensor, gb: Optional[Tensor]) -> float:
        """Largest entry of the minimal-norm subgradient of f."""
        if self.penalty == "group_lasso" and self.lam > 0:
            thr = self.group_weights()
            nrm = Ws.norm(dim=1)
            gn = gW.norm(dim=1)
            zero_part = gW * (1 - thr / gn.clamp_min(1e-300)).clamp_min(0).unsqueeze(-1)
            nz_part = gW + thr.unsqueeze(-1) * Ws / nrm.clamp_min(1e-300).unsqueeze(-1)
            r = torch.where((nrm > 0).unsqueeze(-1), nz_part, zero_part)
        else:
            r = gW
        m = float(r.abs().max()) if r.numel() else 0.0
        if gb is not None:
            m = max(m, float(gb.abs().max()))
        return m


def lbfgs(prob: Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter, bar):
    params = [Ws.clone().requires_grad_(True)]
    if bs is not None:
        params.append(bs.clone().requires_grad_(True))
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=1, max_eval=100, tolerance_grad=0.0,
                            tolerance_change=0.0, history_size=30,
                            line_search_fn="strong_wolfe")
    cache: List[tuple] = []

    def evaluate():
        flat = torch.cat([p.detach().flatten() for p in params])
        for key, val in cache:
            if torch.equal(key, flat):
                return val
        f, gW, gb = prob.smooth(params[0].detach(), None if bs is None else params[1].detach())
        val = (f, gW, gb)
        cache.append((flat.clone(), val))
        del cache[:-4]
        return val

    def closure():
        f, gW, gb = evaluate()
        params[0].grad = gW.clone()
        if bs is not None:
            params[1].grad = gb.clone()
        return f

    f, gW, gb = evaluate()
    trace = [f]
    gnorm = prob.kkt(params[0].detach(), gW, gb)
    converged = gnorm == 0.0
    n_iter = 0
    while not converged and n_iter < max_iter:
        n_iter += 1
        before = torch.cat([p.detach().flatten() for p in params])
        opt.step(closure)
        f, gW, gb = evaluate()
        gnorm = prob.kkt(params[0].detach(), gW, gb)
        converged = (abs(f - trace[-1]) <= tol * max(abs(f), 1.0)) and gnorm <= gtol
        trace.append(f)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(objective=f"{f:.10g}", grad=f"{gnorm:.2g}")
        if not converged and torch.equal(before, torch.cat([p.detach().flatten()
                                                            for p in params])):
            break         # the line search found no decrease: as close as float64 gets
    return (params[0].detach(), None if bs is None else params[1].detach(), trace, n_iter,
            converged, gnorm)


def _fista(prob: Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter, bar,
           step: float = 1.0):
    has_b = bs is not None

    def F(f, W):
        return f + prob.nonsmooth(W)

    x_W, x_b = Ws.clone(), None if bs is None else bs.clone()
    fx, gxW, gxb = prob.smooth(x_W, x_b)
    Fx = F(fx, x_W)
    y_W, y_b, fy, gyW, gyb = x_W, x_b, fx, gxW, gxb
    t = 1.0
    trace = [Fx]
    gnorm = prob.kkt(x_W, gxW, gxb)
    converged = gnorm == 0.0
    n_iter = 0
    while not converged and n_iter < max_iter:
        n_iter += 1
        step *= 1.5
        while True:
            z_W = prob.prox(y_W - step * gyW, step)
            z_b = None if not has_b else y_b - step * gyb
            fz, gzW, gzb = prob.smooth(z_W, z_b)
            dW = z_W - y_W
            quad = float((gyW * dW).sum()) + float((dW * dW).sum()) / (2 * step)
            if has_b:
                db = z_b - y_b
                quad += float((gyb * db).sum()) + float((db * db).sum()) / (2 * step)
            if fz <= fy + quad + 1e-13 * abs(fy) or step < 1e-20:
                break
            step *= 0.5
        Fz = F(fz, z_W)
        if Fz > Fx and y_W is not x_W:
            # momentum overshot: restart from x with a plain proximal step
            t = 1.0
            y_W, y_b, fy, gyW, gyb = x_W, x_b, fx, gxW, gxb
            n_iter -= 1
            continue
        # gradient restart test: (y - z) . (z - x) > 0
        restart = float(((y_W - z_W) * (z_W - x_W)).sum()) + (
            float(((y_b - z_b) * (z_b - x_b)).sum()) if has_b else 0.0) > 0
        t_new = 1.0 if restart else (1 + math.sqrt(1 + 4 * t * t)) / 2
        mom = 0.0 if restart else (t - 1) / t_new
        prev_W, prev_b = x_W, x_b
        x_W, x_b, fx, gxW, gxb, Fx_old, Fx = z_W, z_b, fz, gzW, gzb, Fx, Fz
        t = t_new
        gnorm = prob.kkt(x_W, gxW, gxb)
        converged = abs(Fx - Fx_old) <= tol * max(abs(Fx), 1.0) and gnorm <= gtol
        trace.append(Fx)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(objective=f"{Fx:.10g}", grad=f"{gnorm:.2g}")
        if converged:
            break
        if mom > 0:
            y_W = x_W + mom * (x_W - prev_W)
            y_b = None if not has_b else x_b + mom * (x_b - prev_b)
            fy, gyW, gyb = prob.smooth(y_W, y_b)
        else:
            y_W, y_b, fy, gyW, gyb = x_W, x_b, fx, gxW, gxb
    return x_W, x_b, trace, n_iter, converged, gnorm, step




class _Active:
    """The group-lasso problem restricted to the nonzero rows of W (the
    others held at zero), where the penalty is differentiable: the smooth
    objective L-BFGS polishes."""

    def __init__(self, prob: Problem, active: Tensor):
        self.prob, self.active = prob, active
        self.n_evals = 0

    def smooth(self, Ws, bs):
        f, gW, gb = self.prob.smooth(Ws, bs)
        if self.prob.penalty == "group_lasso" and self.prob.lam > 0:
            thr = self.prob.group_weights()
            nrm = Ws.norm(dim=1)
            f += float((thr * nrm)[self.active].sum())
            gW = gW + thr.unsqueeze(-1) * Ws / nrm.clamp_min(1e-300).unsqueeze(-1)
        gW = gW * self.active.unsqueeze(-1)
        return f, gW, gb

    def kkt(self, Ws, gW, gb):
        m = float(gW.abs().max()) if gW.numel() else 0.0
        return m if gb is None else max(m, float(gb.abs().max()))


def prox_lbfgs(prob: Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter,
                bar, phase: int = 50):
    """Proximal gradient (FISTA) phases, which set rows of W to zero,
    alternating with L-BFGS on the nonzero rows; converged when the whole
    problem's minimal-norm subgradient is within gtol after an L-BFGS phase
    that met the tolerance."""
    trace: List[float] = []
    n_iter, step = 0, 1.0
    converged, gnorm = False, float("inf")
    while n_iter < max_iter:
        Ws, bs, tr, it, converged, gnorm, step = _fista(
            prob, Ws, bs, tol=tol, gtol=gtol, max_iter=min(phase, max_iter - n_iter),
            bar=bar, step=step)
        trace += tr if not trace else tr[1:]
        n_iter += it
        if converged or n_iter >= max_iter:
            break
        active = Ws.norm(dim=1) > 0
        sub = _Active(prob, active)
        Ws, bs, tr, it, sub_conv, _ = lbfgs(sub, Ws, bs, tol=tol, gtol=gtol,
                                             max_iter=min(4 * phase, max_iter - n_iter), bar=bar)
        trace += tr[1:]
        n_iter += it
        f, gW, gb = prob.smooth(Ws, bs)
        gnorm = prob.kkt(Ws, gW, gb)
        converged = sub_conv and gnorm <= gtol and bool((Ws.norm(dim=1) > 0).eq(active).all())
        if converged:
            break
    return Ws, bs, trace, n_iter, converged, gnorm

