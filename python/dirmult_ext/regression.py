r"""Dirichlet-multinomial regression: :func:`fit_regression`,
:class:`DMRegressionFit`, :class:`DirichletMultinomialRegression`.

Model (Chen & Li 2013, Ann. Appl. Stat. 7(1); R's ``MGLM::MGLMreg(dist =
"DM")``): rows b are independent, counts n_b (V,) given their total N_b are
DM(N_b, alpha_b) with

    log alpha[b, v] = X[b] @ W[:, v] + bias[v],     X (B, P), W (P, V), bias (V,).

All V columns of W are identified (unlike a multinomial logit, the
concentrations' total carries information), so every covariate has V
coefficients.

Objective, minimized (on the total log-likelihood's scale, rows weighted by
w_b, default 1):

    -L(W, bias) + pen(W),   L = sum_b w_b log DM(n_b | alpha_b)
    pen = lam/2 ||W||_F^2                 penalty="l2"
    pen = lam sum_p ||W[p, :]||_2          penalty="group_lasso" (a covariate's
                                           V coefficients leave the model together)

The bias is never penalized. Internally the covariates are standardized
(centered when there is a bias, scaled to unit standard deviation, or unit
root mean square without a bias); that is an exact reparametrization (the
penalties are rewritten in its coordinates), and results are reported in
the original ones.

Optimizers:

* ``"lbfgs"`` (default for no penalty and L2): ``torch.optim.LBFGS`` with a
  strong-Wolfe line search on float64 parameters, one L-BFGS iteration per
  outer step (evaluations at the same point are cached, so the convergence
  test costs no extra pass).
* ``"fista"`` (the default, and the only choice, for the group lasso):
  phases of accelerated proximal gradient (FISTA, Beck & Teboulle 2009;
  backtracking on the step, a monotone safeguard, gradient-based momentum
  restart as O'Donoghue & Candes 2015) alternating with L-BFGS on the
  nonzero rows of W, where the penalty is differentiable. The proximal step
  of the group penalty is a row-wise soft threshold, which sets whole rows
  of W exactly to zero; the L-BFGS phases converge fast where plain
  proximal gradient crawls (the DM precision makes the problem
  ill-conditioned). Converged when a FISTA phase meets the tolerance, or
  when an L-BFGS phase does, keeps the same zero rows, and the whole
  problem's optimality measure is then within ``gtol``.

Convergence, with f the objective divided by the total row weight (the mean
per row, in the standardized coordinates): |f_k - f_{k-1}| <= tol *
max(|f_k|, 1) and the largest entry of the gradient of f is at most
``gtol`` (for the group lasso, of the minimal-norm subgradient: for a zero
row p, the part of its gradient beyond the threshold lam / s_p).

Standard errors: observed information, See Note [Regression standard
errors] in docs/ARCHITECTURE.md. With (P + 1) V (or P V without a bias) at
most :data:`MAX_EXACT_SE_PARAMS`, the exact Hessian is built from the rows'
diagonal-plus-rank-one DM Hessians and inverted by Cholesky; above it, SEs
are computed only for the covariates named in ``se_for``, by preconditioned
conjugate gradients on Hessian-vector products (one pass over the rows per
CG iteration), and are NaN for the rest.

Every pass over the data calls :func:`_rows_log_lik` for the value and its
autograd for the gradient; the Hessian terms are computed in float64 with
torch's digamma and trigamma.
"""
from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from .api import log_lik
from .regression_api import log_lik_regression
from .threads import fit_threads

__all__ = ["fit_regression", "DMRegressionFit", "DirichletMultinomialRegression",
           "MAX_EXACT_SE_PARAMS"]

#: Largest number of coefficients ((P + 1) V with a bias) whose exact
#: Hessian is built for the standard errors ((P+1)V squared float64: 72 MB
#: at 3000). Above it, only the covariates in ``se_for`` get SEs, by CG.
MAX_EXACT_SE_PARAMS = 3000

INTERCEPT = "(intercept)"
PENALTIES = (None, "l2", "group_lasso")
_CG_TOL = 1e-10      # relative residual of the CG solves for the SEs
_CG_MAX_ITER = 1000

Reducer = Callable[[Tensor], Tensor]


def _identity(t: Tensor) -> Tensor:
    return t


def _rows_log_lik(counts: Tensor, X: Tensor, W: Tensor, bias: Optional[Tensor],
                  normalize: bool) -> Tensor:
    """Per-row DM log-likelihood (B,) with log alpha = X @ W + bias;
    differentiable with respect to X, W and bias. The one place the
    regression computes the likelihood: the fused op on the CPU; on CUDA
    ``X @ W + bias`` then the per-sample ``log_lik``, 2.7x faster there than
    the fused kernels today (BENCHMARKS.md, DM regression)."""
    if not counts.is_cuda:
        return log_lik_regression(counts, X, W, bias, normalize=normalize)
    eta = X @ W
    if bias is not None:
        eta = eta + bias
    return log_lik(counts, eta, normalize=normalize)


# ---------------------------------------------------------------------------
# the result
# ---------------------------------------------------------------------------
def _p_value(z: Tensor) -> Tensor:
    """Two-sided normal p-value."""
    return torch.special.erfc(z.abs() / math.sqrt(2.0))


@dataclass
class DMRegressionFit:
    """Result of :func:`fit_regression`; float64 CPU tensors.

    Attributes:
        W: ``(P, V)`` coefficients; ``bias``: ``(V,)`` intercepts (zeros
            when fitted without a bias).
        log_lik: the (weighted) log-likelihood at the estimate, normalized
            pmf (without the penalty); ``objective``: -log_lik + penalty.
        null_log_lik: the intercept-only fit's log-likelihood (the start;
            NaN without a bias), for a likelihood-ratio test.
        n_iter, converged, grad_norm: iterations, whether the tolerance was
            met, the final convergence measure (module docstring).
        se_W, se_bias, z_W, z_bias, p_W, p_bias: standard errors, Wald z and
            two-sided normal p-values, NaN where not computed.
        cov: ``((P + 1) V, (P + 1) V)`` covariance of (W flattened row by
            row, then bias) when the exact Hessian was built, else None.
        se_method: ``"exact"``, ``"cg"`` or ``None`` (no SEs).
        covariate_names, category_names: P and V names.
    """
    W: Tensor
    bias: Tensor
    log_lik: float
    objective: float
    null_log_lik: float
    n_iter: int
    converged: bool
    grad_norm: float
    method: str
    penalty: Optional[str]
    lam: float
    has_bias: bool
    se_W: Tensor
    se_bias: Tensor
    z_W: Tensor
    z_bias: Tensor
    p_W: Tensor
    p_bias: Tensor
    cov: Optional[Tensor] = field(default=None, repr=False)
    se_method: Optional[str] = None
    covariate_names: List[str] = field(default_factory=list)
    category_names: List[str] = field(default_factory=list)
    n_rows: int = 0
    objective_trace: List[float] = field(default_factory=list, repr=False)

    def predict_log_alpha(self, X) -> Tensor:
        """``(B, V)`` log concentrations ``X @ W + bias`` (float64)."""
        X = _as_covariates(X, None, self.W.shape[0], "X")
        return X @ self.W + self.bias

    def predict(self, X) -> Tensor:
        """``(B, V)`` expected proportions alpha / sum(alpha) (float64)."""
        return torch.softmax(self.predict_log_alpha(X), -1)

    def to_table(self, include_intercept: bool = True) -> List[dict]:
        """One dict per coefficient (covariate, category, estimate, se, z,
        p), sorted by p (NaN last), intercepts as covariate
        ``"(intercept)"``."""
        rows = []
        P, V = self.W.shape
        blocks = [(self.covariate_names[p], self.W[p], self.se_W[p], self.z_W[p], self.p_W[p])
                  for p in range(P)]
        if include_intercept and self.has_bias:
            blocks.append((INTERCEPT, self.bias, self.se_bias, self.z_bias, self.p_bias))
        for name, est, se, z, p in blocks:
            for v in range(V):
                rows.append(dict(covariate=name, category=self.category_names[v],
                                 estimate=float(est[v]), se=float(se[v]), z=float(z[v]),
                                 p=float(p[v])))
        rows.sort(key=lambda r: (math.isnan(r["p"]), r["p"], -abs(r["z"])
                                 if not math.isnan(r["z"]) else 0.0))
        return rows

    def summary(self, top: Optional[int] = 20, include_intercept: bool = False) -> str:
        """A text table of the ``top`` coefficients by p-value (all if None)."""
        pen = "none" if self.penalty is None else f"{self.penalty}, lam={self.lam:g}"
        lines = [f"Dirichlet-multinomial regression: {self.n_rows} rows, "
                 f"{self.W.shape[0]} covariates, {self.W.shape[1]} categories, "
                 f"bias={self.has_bias}, penalty {pen}",
                 f"  log-likelihood {self.log_lik:.4f}"
                 + (f" (intercept only {self.null_log_lik:.4f})"
                    if not math.isnan(self.null_log_lik) else "")
                 + f"; {self.method}, {self.n_iter} iterations, converged={self.converged}",
                 f"  standard errors: {self.se_method or 'not computed'}"]
        rows = self.to_table(include_intercept)
        shown = rows if top is None else rows[:top]
        wc = max([len("covariate")] + [len(r["covariate"]) for r in shown])
        wk = max([len("category")] + [len(r["category"]) for r in shown])
        lines.append(f"  {'covariate':<{wc}}  {'category':<{wk}}  {'estimate':>11}  "
                     f"{'s.e.':>10}  {'z':>8}  {'p':>10}")
        for r in shown:
            lines.append(f"  {r['covariate']:<{wc}}  {r['category']:<{wk}}  "
                         f"{r['estimate']:>11.5g}  {r['se']:>10.4g}  {r['z']:>8.3f}  "
                         f"{r['p']:>10.3g}")
        if top is not None and len(rows) > top:
            lines.append(f"  ... {len(rows) - top} more")
        return "\n".join(lines)

    def to_csv(self, path, include_intercept: bool = True) -> None:
        """Write :meth:`to_table` as CSV (header covariate,category,estimate,se,z,p)."""
        import csv
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["covariate", "category", "estimate", "se", "z", "p"])
            for r in self.to_table(include_intercept):
                w.writerow([r["covariate"], r["category"]] +
                           [repr(r[k]) for k in ("estimate", "se", "z", "p")])


# ---------------------------------------------------------------------------
# input handling
# ---------------------------------------------------------------------------
def _as_covariates(X, B: Optional[int], P: Optional[int] = None, name: str = "X") -> Tensor:
    if isinstance(X, np.ndarray):
        if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
            raise TypeError(f"{name} must be numeric, got a numpy array of dtype {X.dtype} "
                            "(encode categorical covariates as 0/1 columns)")
        X = torch.from_numpy(np.ascontiguousarray(X))
    if not isinstance(X, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(X).__name__}")
    if X.is_complex():
        raise TypeError(f"{name} must be real, got {X.dtype}")
    if X.dim() == 1:
        X = X.unsqueeze(-1)
    if X.dim() != 2:
        raise ValueError(f"{name} must be a (rows, covariates) matrix, got shape "
                         f"{tuple(X.shape)}")
    if B is not None and X.shape[0] != B:
        raise ValueError(f"{name} has {X.shape[0]} rows but counts has {B}: one row of "
                         "covariates per row of counts")
    if P is not None and X.shape[1] != P:
        raise ValueError(f"{name} has {X.shape[1]} columns, the fit {P} covariates")
    X = X.to(torch.float64)
    bad = ~torch.isfinite(X)
    if bool(bad.any()):
        i, j = (int(t) for t in bad.nonzero()[0])
        raise ValueError(f"{name} must be finite: {float(X[i, j])} at row {i + 1}, column {j + 1} "
                         f"(1-based; {int(bad.sum())} in all)")
    return X


def _as_dense_counts(counts):
    """A (B, V) counts tensor, or SparseCounts (densified a batch at a time)."""
    from .fit import _as_counts
    return _as_counts(counts)


def _names(names, n: int, what: str, default_prefix: str) -> List[str]:
    if names is None:
        return [f"{default_prefix}{i + 1}" for i in range(n)]
    names = [str(s) for s in names]
    if len(names) != n:
        raise ValueError(f"{what} has {len(names)} names for {n} columns")
    return names


class _Data:
    """Rows of counts (B, V) with standardized covariates (B, P) and row
    weights, visited in batches on ``device``."""

    def __init__(self, counts, X: Tensor, weights: Optional[Tensor], device,
                 batch_size: Optional[int]):
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.device = device
        self.B, self.V = counts.shape
        self.P = X.shape[1]
        self.streaming = batch_size is not None and batch_size < self.B
        self.batch_size = batch_size if batch_size is not None else max(self.B, 1)
        self.counts = counts if batch_size is not None else counts.to(device)
        self.X = X if batch_size is not None else X.to(device)
        self.weights = weights
        self.mu = torch.zeros(self.P, dtype=torch.float64, device=device)
        self.scale = torch.ones(self.P, dtype=torch.float64, device=device)
        self._Xs = None
        self._cache = {}

    def set_standardization(self, mu: Tensor, scale: Tensor) -> None:
        self.mu, self.scale = mu.to(self.device), scale.to(self.device)
        if not self.streaming:
            self._Xs = (self.X - self.mu) / self.scale

    def batches(self, standardized: bool = True):
        """Yield (index, counts (b, V) dense on device, X (b, P) float64, w (b,) or None)."""
        from .sparse import SparseCounts
        for i, s in enumerate(range(0, self.B, self.batch_size)):
            e = min(s + self.batch_size, self.B)
            cb = self.counts[s:e].to(self.device, non_blocking=True)
            if isinstance(cb, SparseCounts):
                cb = cb.to_dense()
            if standardized and self._Xs is not None:
                xb = self._Xs[s:e]
            else:
                xb = self.X[s:e].to(self.device, torch.float64)
                if standardized:
                    xb = (xb - self.mu) / self.scale
            wb = None if self.weights is None else self.weights[s:e].to(self.device)
            yield i, cb, xb, wb


# ---------------------------------------------------------------------------
# passes over the data
# ---------------------------------------------------------------------------
def _prepass(data: _Data, reduce: Reducer):
    """Counts checked; totals: row count, weight, the normalizing constant,
    covariate sums and squares."""
    dev, P = data.device, data.P
    acc = torch.zeros(5 + 2 * P, dtype=torch.float64, device=dev)
    for _, cb, xb, wb in data.batches(standardized=False):
        c = cb.to(torch.float64)
        bad = (~torch.isfinite(c)).sum() + (c < 0).sum()
        N = c.sum(-1)
        const = torch.lgamma(N + 1) - torch.lgamma(c + 1).sum(-1)
        w = torch.ones_like(N) if wb is None else wb
        acc += torch.cat([torch.stack([bad.to(torch.float64),
                                       torch.tensor(float(c.shape[0]), dtype=torch.float64,
                                                    device=dev),
                                       w.sum(), (w * const).sum(), (w * (N > 0)).sum()]),
                          xb.sum(0), (xb * xb).sum(0)])
    acc = reduce(acc)
    if float(acc[0]) > 0:
        raise ValueError("counts must be finite and non-negative")
    n, wsum, C = float(acc[1]), float(acc[2]), float(acc[3])
    if float(acc[4]) <= 0:
        raise ValueError("counts: no row with a positive total and a positive weight: "
                         "nothing to fit")
    return n, wsum, C, acc[5:5 + P], acc[5 + P:]


def _row_terms(cb: Tensor, eta: Tensor):
    """Per-row Hessian of the DM log-likelihood with respect to log alpha:
    H_b = diag(d_b) + c_b a_b a_b^T (See Note [Regression standard errors])."""
    n = cb.to(torch.float64)
    a = eta.exp()
    A = a.sum(-1)
    N = n.sum(-1)
    nz = n > 0
    dp = torch.where(nz, torch.digamma(a + n) - torch.digamma(a), torch.zeros_like(a))
    tp = torch.where(nz, torch.polygamma(1, a + n) - torch.polygamma(1, a), torch.zeros_like(a))
    pos = N > 0
    dA = torch.where(pos, torch.digamma(A + N) - torch.digamma(A), torch.zeros_like(A))
    c = torch.where(pos, torch.polygamma(1, A) - torch.polygamma(1, A + N), torch.zeros_like(A))
    d = a * dp + a * a * tp - a * dA.unsqueeze(-1)
    return a, d, c


def _augment(xb: Tensor, has_bias: bool) -> Tensor:
    if not has_bias:
        return xb
    return torch.cat([xb, torch.ones(xb.shape[0], 1, dtype=xb.dtype, device=xb.device)], 1)


class _Problem:
    """The objective in standardized coordinates, per unit row weight."""

    def __init__(self, data: _Data, has_bias: bool, penalty, lam: float, wsum: float,
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
                ll = _rows_log_lik(cb, xb, W_, b_, False)
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


def _lbfgs(prob: _Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter, bar):
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


def _fista(prob: _Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter, bar,
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

    def __init__(self, prob: _Problem, active: Tensor):
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


def _prox_lbfgs(prob: _Problem, Ws: Tensor, bs: Optional[Tensor], *, tol, gtol, max_iter,
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
        Ws, bs, tr, it, sub_conv, _ = _lbfgs(sub, Ws, bs, tol=tol, gtol=gtol,
                                             max_iter=min(4 * phase, max_iter - n_iter), bar=bar)
        trace += tr[1:]
        n_iter += it
        f, gW, gb = prob.smooth(Ws, bs)
        gnorm = prob.kkt(Ws, gW, gb)
        converged = sub_conv and gnorm <= gtol and bool((Ws.norm(dim=1) > 0).eq(active).all())
        if converged:
            break
    return Ws, bs, trace, n_iter, converged, gnorm

# ---------------------------------------------------------------------------
# standard errors
# ---------------------------------------------------------------------------
def _information(data: _Data, Theta: Tensor, has_bias: bool, reduce: Reducer) -> Tensor:
    """Observed information -d^2 L (standardized coordinates), (P'V, P'V)
    for Theta (P', V) = [W_s; bias_s]."""
    Pa, V = Theta.shape
    n = Pa * V
    dev = Theta.device
    I = torch.zeros(n, n, dtype=torch.float64, device=dev)
    Idiag = torch.zeros(Pa, Pa, V, dtype=torch.float64, device=dev)
    chunk = max(1, (1 << 22) // max(n, 1))
    for _, cb, xb, wb in data.batches():
        xa = _augment(xb, has_bias)
        for s in range(0, xa.shape[0], chunk):
            x = xa[s:s + chunk]
            w = None if wb is None else wb[s:s + chunk]
            a, d, c = _row_terms(cb[s:s + chunk], x @ Theta)
            xw = x if w is None else x * w.unsqueeze(-1)
            Idiag -= torch.einsum("bp,bq,bv->pqv", xw, x, d)
            Y = (x.unsqueeze(-1) * a.unsqueeze(1)).reshape(x.shape[0], n)
            cw = c if w is None else c * w
            I -= (Y * cw.unsqueeze(-1)).T @ Y
    I.view(Pa, V, Pa, V).diagonal(dim1=1, dim2=3).add_(Idiag)
    return reduce(I)


def _penalty_hessian(prob: _Problem, Ws: Tensor, active: Tensor) -> Tensor:
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


def _transform(P: int, has_bias: bool, mu: Tensor, scale: Tensor) -> Tensor:
    """T0 (P', P'): original coefficients (per category) = T0 @ standardized:
    W[p] = W_s[p] / s_p, bias = bias_s - sum_p mu_p W_s[p] / s_p."""
    Pa = P + int(has_bias)
    T0 = torch.zeros(Pa, Pa, dtype=torch.float64, device=scale.device)
    T0[range(P), range(P)] = 1 / scale
    if has_bias:
        T0[P, :P] = -mu / scale
        T0[P, P] = 1.0
    return T0


def _exact_cov(data, prob, Ws, bs, has_bias, active_rows, T0, reduce):
    """Covariance of the original coefficients ((P'V)^2) from the exact
    information, or None (with a warning) when it is not positive definite."""
    P, V = Ws.shape
    Theta = Ws if bs is None else torch.cat([Ws, bs.unsqueeze(0)])
    Pa = Theta.shape[0]
    I = _information(data, Theta, has_bias, reduce)
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


def _cg_variances(data, prob, Ws, bs, has_bias, rows_req: List[int], T0, reduce,
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
        t = _row_terms(cb, xa @ Theta)
        if not data.streaming:
            terms[i] = t
        return t

    # Jacobi preconditioner: diag of the information
    dg = torch.zeros(Pa, V, dtype=torch.float64, device=dev)
    for i, cb, xb, wb in data.batches():
        xa = _augment(xb, has_bias)
        a, d, c = row_terms(i, cb, xa)
        xw = xa * xa if wb is None else xa * xa * wb.unsqueeze(-1)
        dg -= xw.T @ (d + c.unsqueeze(-1) * a * a)
    dg = reduce(dg)
    dg[:P] += ph.diagonal(dim1=1, dim2=2)
    dg = torch.where(dg > 0, dg, torch.ones_like(dg))

    def apply(Vd):                                      # Vd (Pa, V, k)
        out = torch.zeros_like(Vd)
        for i, cb, xb, wb in data.batches():
            xa = _augment(xb, has_bias)
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


def _rows_for(se_for, covariate_names: List[str], has_bias: bool) -> List[int]:
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


# ---------------------------------------------------------------------------
# the fit
# ---------------------------------------------------------------------------
def fit_regression(counts, X, *, bias: bool = True, penalty: Optional[str] = None,
                   lam: float = 0.0, method: str = "auto", tol: float = 1e-9,
                   gtol: float = 1e-6, max_iter: int = 1000, batch_size: Optional[int] = None,
                   weights=None, device=None, progress: bool = False, group=None,
                   se: bool = True, se_for=None, covariate_names: Optional[Sequence] = None,
                   category_names: Optional[Sequence] = None) -> DMRegressionFit:
    r"""Dirichlet-multinomial regression, log alpha[b] = X[b] @ W + bias, by
    (penalized) maximum likelihood.

    Args:
        counts: ``(B, V)`` non-negative counts (tensor, numpy array, or the
            sparse forms :func:`dirmult_ext.fit` takes, densified a batch at
            a time). Rows with zero total add nothing.
        X: ``(B, P)`` numeric, finite covariates (a ``(B,)`` vector is one
            covariate). Categorical covariates must be coded as numbers.
        bias: fit a per-category intercept (never penalized).
        penalty: None, ``"l2"`` (``lam/2 ||W||_F^2``) or ``"group_lasso"``
            (``lam sum_p ||W[p, :]||_2``: rows of W, one per covariate, become
            exactly zero for large lam), added to the negative total
            log-likelihood.
        lam: the penalty's weight (>= 0), on the total log-likelihood's scale.
        method: ``"auto"`` (L-BFGS, or FISTA for the group lasso), ``"lbfgs"``
            or ``"fista"`` (module docstring).
        tol, gtol: convergence: relative change of the per-row objective at
            most ``tol`` and largest gradient entry (per unit row weight, in
            standardized coordinates; the minimal-norm subgradient for the
            group lasso) at most ``gtol``.
        max_iter: iteration limit.
        batch_size: visit the rows in batches of this many, each moved to
            ``device`` in turn (counts and X may stay on the CPU, larger than
            device memory); every statistic is summed over batches.
        weights: ``(B,)`` non-negative row (frequency) weights.
        device: where to compute (default: counts' device).
        progress: a tqdm bar over the iterations (rank 0 only).
        group: a ``torch.distributed`` process group (or the default group
            when ``torch.distributed`` is initialized and ``group`` is
            ``"world"``): every rank passes its own rows, all other arguments
            equal; the statistics of each pass are summed by ``all_reduce``
            and every rank returns the same fit.
        se: compute standard errors (observed information; for L2 the
            penalized Hessian, for the group lasso the penalized Hessian on
            the nonzero rows and the bias only, zero rows NaN; penalized SEs
            ignore the penalty's bias and the selection and are approximate).
            With more than :data:`MAX_EXACT_SE_PARAMS` coefficients, only
            the covariates in ``se_for`` get them (by CG).
        se_for: covariate names or indices (``"(intercept)"`` for the bias)
            whose SEs are computed above the exact limit; ignored below it.
        covariate_names, category_names: P and V names for the tables
            (default ``x1..xP``, ``v1..vV``).

    Returns:
        :class:`DMRegressionFit` (float64, CPU).

    Starts at W = 0 and bias = the log concentrations of a single DM fit
    (:func:`dirmult_ext.fit`, the W = 0 optimum).
    """
    from .fit import _Rows, _fit_rows, _as_weights
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be None, 'l2' or 'group_lasso', got {penalty!r}")
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    if penalty is None and lam != 0:
        raise ValueError("lam is set but penalty is None: pass penalty='l2' or 'group_lasso'")
    if method == "auto":
        method = "fista" if penalty == "group_lasso" else "lbfgs"
    if method not in ("lbfgs", "fista"):
        raise ValueError(f"method must be 'auto', 'lbfgs' or 'fista', got {method!r}")
    if method == "lbfgs" and penalty == "group_lasso" and lam > 0:
        raise ValueError("the group lasso is not differentiable: use method='fista'")
    if not (tol > 0) or not (gtol > 0):
        raise ValueError(f"tol and gtol must be positive, got {tol!r}, {gtol!r}")
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")

    reduce: Reducer = _identity
    rank0 = True
    if group is not None:
        import torch.distributed as dist
        from .distributed import _all_reduce_sum
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("fit_regression(group=...) needs an initialized "
                               "torch.distributed process group")
        g = None if isinstance(group, str) and group == "world" else group
        reduce = _all_reduce_sum(g)
        rank0 = dist.get_rank(g) == 0

    counts = _as_dense_counts(counts)
    B, V = counts.shape
    X = _as_covariates(X, B)
    P = X.shape[1]
    if P == 0:
        raise ValueError("X has no columns: use dirmult_ext.fit for the intercept-only model")
    dev = counts.device if device is None else torch.device(device)
    w = _as_weights(weights, B, "cpu" if batch_size is not None else dev)
    covariate_names = _names(covariate_names, P, "covariate_names", "x")
    category_names = _names(category_names, V, "category_names", "v")
    if group is not None:   # the shapes must agree across ranks (every rank raises)
        vv = torch.tensor([V, -V, P, -P], dtype=torch.int64, device=dev)
        dist.all_reduce(vv, op=dist.ReduceOp.MAX, group=g)
        if int(vv[0]) != V or -int(vv[1]) != V or int(vv[2]) != P or -int(vv[3]) != P:
            raise ValueError("every rank must pass counts with the same number of "
                             "categories and X with the same number of covariates")
    elif B == 0:
        raise ValueError("counts has no rows")

    with fit_threads(B * V * (P + 1), dev):  # See Note [Fit threads]
        data = _Data(counts, X, w, dev, batch_size)
        n_rows, wsum, C, sx, sxx = _prepass(data, reduce)
        if wsum <= 0:
            raise ValueError("the rows have zero total weight: nothing to fit")
        mu = sx / n_rows
        if bias:
            var = (sxx / n_rows - mu * mu).clamp_min(0)
            const = var <= 1e-12 * mu * mu + 1e-300
            scale = var.sqrt()
        else:
            scale = (sxx / n_rows).sqrt()
            const = scale == 0
            mu = torch.zeros_like(mu)
        if bool(const.any()):
            j = int(const.nonzero()[0])
            what = ("constant: with bias=True it duplicates the intercept (drop it, or pass "
                    "bias=False)" if bias else "all zeros")
            raise ValueError(f"X column {j + 1} ({covariate_names[j]}) is {what}")
        data.set_standardization(mu, scale)

        # start: W = 0, bias = a single DM fit (its optimum at W = 0)
        null_ll = float("nan")
        if bias:
            rows = _Rows(counts, w, dev, batch_size)
            dm = _fit_rows(rows, init=None, method="newton", tol=1e-10, gtol=1e-7,
                           max_iter=500, min_alpha=1e-10, progress=False, reduce=reduce)
            bs0 = dm.log_alpha.to(dev)
            null_ll = dm.log_lik
        else:
            bs0 = None
        Ws0 = torch.zeros(P, V, dtype=torch.float64, device=dev)
        prob = _Problem(data, bias, penalty, float(lam), wsum, reduce)
        bar = None
        if progress and rank0:
            from tqdm.auto import tqdm
            bar = tqdm(total=max_iter, desc="fit_regression", file=sys.stderr, leave=False)
        try:
            run = _lbfgs if method == "lbfgs" else _prox_lbfgs
            Ws, bs, trace, n_iter, converged, gnorm = run(prob, Ws0, bs0, tol=tol, gtol=gtol,
                                                          max_iter=max_iter, bar=bar)
        finally:
            if bar is not None:
                bar.close()
        if not converged:
            warnings.warn(f"fit_regression: not converged in {n_iter} iterations (gradient "
                          f"{gnorm:.3g}, gtol {gtol:g})", RuntimeWarning, stacklevel=2)

        T0 = _transform(P, bias, mu, scale)
        Theta_s = Ws if bs is None else torch.cat([Ws, bs.unsqueeze(0)])
        Theta = T0 @ Theta_s
        W_hat = Theta[:P]
        b_hat = Theta[P] if bias else torch.zeros(V, dtype=torch.float64, device=dev)
        f_smooth = trace[-1] - prob.nonsmooth(Ws)
        pen_total = trace[-1] * wsum
        ll_unnorm = -f_smooth * wsum
        if penalty == "l2":
            ll_unnorm += 0.5 * lam * float((W_hat * W_hat).sum())
        log_lik_total = ll_unnorm + C

        nan = torch.full((P + 1, V), float("nan"), dtype=torch.float64)
        se_all = nan.clone()
        cov = None
        se_method = None
        active = Ws.norm(dim=1) > 0 if penalty == "group_lasso" and lam > 0 else \
            torch.ones(P, dtype=torch.bool, device=dev)
        if se:
            n_par = (P + int(bias)) * V
            if n_par <= MAX_EXACT_SE_PARAMS:
                cov = _exact_cov(data, prob, Ws, bs, bias, active, T0, reduce)
                if cov is not None:
                    cov = cov.cpu()
                    se_method = "exact"
                    sd = cov.diagonal().clamp_min(0).sqrt().view(P + int(bias), V)
                    se_all[:P + int(bias)] = sd
            else:
                req = _rows_for(se_for, covariate_names, bias)
                if not req:
                    warnings.warn(f"fit_regression: {n_par} coefficients exceed "
                                  f"MAX_EXACT_SE_PARAMS = {MAX_EXACT_SE_PARAMS}; standard errors "
                                  "are computed only for the covariates named in se_for (by "
                                  "conjugate gradients)", RuntimeWarning, stacklevel=2)
                else:
                    var = _cg_variances(data, prob, Ws, bs, bias, req, T0, reduce, active).cpu()
                    for i, r in enumerate(req):
                        se_all[r] = var[i].clamp_min(0).sqrt()
                    se_method = "cg"
            # group lasso: zero rows have no SE
            se_all[:P][~active.cpu()] = float("nan")
        W_hat, b_hat = W_hat.cpu(), b_hat.cpu()
        est = torch.cat([W_hat, b_hat.unsqueeze(0)])
        z = est / se_all
        p = _p_value(z)
        if not bias:
            se_all[P] = z[P] = p[P] = float("nan")
        return DMRegressionFit(
            W=W_hat, bias=b_hat, log_lik=float(log_lik_total), objective=float(pen_total - C),
            null_log_lik=null_ll, n_iter=n_iter, converged=bool(converged), grad_norm=gnorm,
            method=method, penalty=penalty, lam=float(lam), has_bias=bias,
            se_W=se_all[:P], se_bias=se_all[P], z_W=z[:P], z_bias=z[P], p_W=p[:P], p_bias=p[P],
            cov=cov, se_method=se_method, covariate_names=covariate_names,
            category_names=category_names, n_rows=int(n_rows),
            objective_trace=[x * wsum - C for x in trace])


    # ---------------------------------------------------------------------------
    # the module
    # ---------------------------------------------------------------------------
class DirichletMultinomialRegression(nn.Module):
    """A DM output layer: ``log alpha = x @ weight + bias``, ``forward(x,
    counts)`` the per-row log-likelihood ``(B,)`` (use ``-out.mean()`` as
    the loss).

    Args:
        in_features: P; num_categories: V.
        bias: learn a per-category intercept.
        normalize: add the multinomial coefficient to the log-likelihood.
        dtype: the parameters' dtype.

    ``weight`` is ``(P, V)`` (as in ``x @ weight``, the transpose of
    ``nn.Linear``'s), initialized like ``nn.Linear`` (uniform in
    +-1/sqrt(P)); ``bias`` starts at zero. Works under ``torch.compile`` and
    ``torch.jit.script``.
    """

    def __init__(self, in_features: int, num_categories: int, bias: bool = True,
                 normalize: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        if in_features < 1 or num_categories < 2:
            raise ValueError(f"need in_features >= 1 and num_categories >= 2, got "
                             f"{in_features}, {num_categories}")
        self.in_features = in_features
        self.num_categories = num_categories
        self.normalize = normalize
        self.weight = nn.Parameter(torch.empty(in_features, num_categories, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.zeros(num_categories, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    @torch.jit.export
    def log_alpha(self, x: Tensor) -> Tensor:
        """``(B, V)`` log concentrations."""
        out = x @ self.weight
        if self.bias is not None:
            out = out + self.bias
        return out

    @torch.jit.export
    def predict(self, x: Tensor) -> Tensor:
        """``(B, V)`` expected proportions alpha / sum(alpha)."""
        return torch.softmax(self.log_alpha(x), -1)

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError("x's last dimension must equal in_features")
        if counts.shape[-1] != self.num_categories:
            raise ValueError("counts' last dimension must equal num_categories")
        if torch.jit.is_scripting():
            la = self.log_alpha(x)
            if counts.dtype == torch.float64:
                la = la.to(torch.float64)
            return torch.ops.dirmult.log_lik(counts, la, self.normalize)
        return self._eager(x, counts)

    @torch.jit.unused
    def _eager(self, x: Tensor, counts: Tensor) -> Tensor:
        return _rows_log_lik(counts, x, self.weight, self.bias, self.normalize)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, num_categories={self.num_categories}, "
                f"bias={self.bias is not None}, normalize={self.normalize}")
