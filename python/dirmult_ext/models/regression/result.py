"""The result of a DM regression fit: coefficients, standard errors, Wald
tables, predictions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torch import Tensor

from .data import INTERCEPT, as_covariates


def p_value(z: Tensor) -> Tensor:
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
        X = as_covariates(X, None, self.W.shape[0], "X")
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


