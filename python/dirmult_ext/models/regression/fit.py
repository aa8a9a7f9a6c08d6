r"""Dirichlet-multinomial regression: :func:`fit_regression` (the result
:class:`DMRegressionFit` is in ``result``, the output layer
:class:`DirichletMultinomialRegression` in ``module``; the data and passes
over it in ``data``, the optimizers in ``optim`` and ``newton``, the
standard errors in ``se``, all in ``dirmult_ext.models.regression``).

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

Optimizers (``method="auto"``: Newton for no penalty and L2 up to
:data:`MAX_NEWTON_PARAMS` coefficients n = (P + 1) V with (P + 1) n at most
:data:`MAX_NEWTON_WORK`, else L-BFGS; FISTA for the group lasso):

* ``"newton"``: Newton's method with the exact Hessian of the objective (the
  observed information below, plus the L2 penalty's diagonal), solved by
  Cholesky; where the Hessian is not positive definite a Levenberg shift
  ``H + mu I`` (mu growing tenfold until it factors), and a backtracking
  line search on the objective. Each iteration is one pass for the value
  and gradient and one for the dense Hessian (n^2 per row); it converges in
  5-8 iterations where L-BFGS takes 20-60. If the line search finds no
  decrease before the gradient meets ``gtol``, L-BFGS continues from there.
  Works with weights, ``batch_size`` (each pass streams) and ``group``.
* ``"lbfgs"`` (above Newton's size): ``torch.optim.LBFGS`` with a
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
autograd for the gradient; the Hessian terms are computed in float64 by
``dirmult::tpoch_terms`` (See Note [Trigamma terms]).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional, Sequence

import torch

from ..arg_checks import check_device
from .data import INTERCEPT, PENALTIES, Reducer, as_covariates, as_dense_counts, RegressionData, identity, column_names, design_prepass
from .module import DirichletMultinomialRegression
from .newton import MAX_NEWTON_PARAMS, MAX_NEWTON_WORK, newton
from .optim import Problem, lbfgs, prox_lbfgs
from .result import DMRegressionFit, p_value
from .se import MAX_EXACT_SE_PARAMS, cg_variances, exact_cov, rows_for, standardized_to_original
from ...data.counts import RowSource
from ..progress import progress_bar
from ...data.threads import fit_threads

__all__ = ["fit_regression", "DMRegressionFit", "DirichletMultinomialRegression",
           "MAX_EXACT_SE_PARAMS", "MAX_NEWTON_PARAMS", "MAX_NEWTON_WORK",
           "INTERCEPT"]


def fit_regression(counts, X, *, bias: bool = True, penalty: Optional[str] = None,
                   lam: float = 0.0, method: str = "auto", tol: float = 1e-9,
                   gtol: float = 1e-6, max_iter: int = 1000, batch_size: Optional[int] = None,
                   weights=None, device=None, progress: Optional[bool] = None, group=None,
                   se: bool = True, se_for=None, covariate_names: Optional[Sequence] = None,
                   category_names: Optional[Sequence] = None) -> DMRegressionFit:
    r"""Dirichlet-multinomial regression, log alpha[b] = X[b] @ W + bias, by
    (penalized) maximum likelihood.

    Args:
        counts: ``(B, V)`` non-negative counts (tensor, numpy array, or the
            sparse forms and the RowSource :func:`dirmult_ext.fit` takes,
            densified a batch at a time). Rows with zero total add nothing.
        X: ``(B, P)`` numeric, finite covariates (a ``(B,)`` vector is one
            covariate). Categorical covariates must be coded as numbers.
        bias: fit a per-category intercept (never penalized).
        penalty: None, ``"l2"`` (``lam/2 ||W||_F^2``) or ``"group_lasso"``
            (``lam sum_p ||W[p, :]||_2``: rows of W, one per covariate, become
            exactly zero for large lam), added to the negative total
            log-likelihood.
        lam: the penalty's weight (>= 0), on the total log-likelihood's scale.
        method: ``"auto"`` (default: Newton with the exact Hessian for no
            penalty or L2 when the coefficients n = (P + 1) V are at most
            :data:`MAX_NEWTON_PARAMS` and (P + 1) n at most
            :data:`MAX_NEWTON_WORK`, L-BFGS above; FISTA for the group
            lasso), ``"newton"`` (Newton at any size: its dense (n, n)
            Hessian costs n^2 per row and n^3 / 3 to factor), ``"lbfgs"``
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
        progress: report the iterations on stderr (a tqdm bar, or plain lines
            without tqdm; rank 0 only): True from the start, False never,
            None (default) on a terminal once the fit has taken 2 s.
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
    from ..engine import Rows, as_weights
    from ..fit import fit_rows
    if penalty not in PENALTIES:
        raise ValueError(f"penalty must be None, 'l2' or 'group_lasso', got {penalty!r}")
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    if penalty is None and lam != 0:
        raise ValueError("lam is set but penalty is None: pass penalty='l2' or 'group_lasso'")
    if method not in ("auto", "newton", "lbfgs", "fista"):
        raise ValueError(f"method must be 'auto', 'newton', 'lbfgs' or 'fista', got {method!r}")
    if method in ("lbfgs", "newton") and penalty == "group_lasso" and lam > 0:
        raise ValueError("the group lasso is not differentiable: use method='fista'")
    if not (tol > 0) or not (gtol > 0):
        raise ValueError(f"tol and gtol must be positive, got {tol!r}, {gtol!r}")
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")

    reduce: Reducer = identity
    rank0 = True
    if group is not None:
        import torch.distributed as dist
        from ..collective import all_reduce_sum
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("fit_regression(group=...) needs an initialized "
                               "torch.distributed process group")
        g = None if isinstance(group, str) and group == "world" else group
        reduce = all_reduce_sum(g)
        rank0 = dist.get_rank(g) == 0

    counts = as_dense_counts(counts)
    if isinstance(counts, RowSource) and batch_size is None:  # read a block at a time
        batch_size = counts.block_rows
    B, V = counts.shape
    X = as_covariates(X, B)
    P = X.shape[1]
    if P == 0:
        raise ValueError("X has no columns: use dirmult_ext.fit for the intercept-only model")
    if method == "auto":
        n_coef = (P + int(bias)) * V
        method = "fista" if penalty == "group_lasso" else "newton" if (
            n_coef <= MAX_NEWTON_PARAMS and (P + int(bias)) * n_coef <= MAX_NEWTON_WORK) \
            else "lbfgs"
    dev = counts.device if device is None else check_device(device)
    w = as_weights(weights, B, "cpu" if batch_size is not None else dev)
    covariate_names = column_names(covariate_names, P, "covariate_names", "x")
    category_names = column_names(category_names, V, "category_names", "v")
    if group is not None:   # the shapes must agree across ranks (every rank raises)
        vv = torch.tensor([V, -V, P, -P], dtype=torch.int64, device=dev)
        dist.all_reduce(vv, op=dist.ReduceOp.MAX, group=g)
        if int(vv[0]) != V or -int(vv[1]) != V or int(vv[2]) != P or -int(vv[3]) != P:
            raise ValueError("every rank must pass counts with the same number of "
                             "categories and X with the same number of covariates")
    elif B == 0:
        raise ValueError("counts has no rows")

    with fit_threads(B * V * (P + 1), dev):  # See Note [Fit threads]
        data = RegressionData(counts, X, w, dev, batch_size)
        n_rows, wsum, C, sx, sxx = design_prepass(data, reduce)
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
            rows = Rows(counts, w, dev, batch_size)
            dm = fit_rows(rows, init=None, method="newton", tol=1e-10, gtol=1e-7,
                           max_iter=500, min_alpha=1e-10, progress=False, reduce=reduce)
            bs0 = dm.log_alpha.to(dev)
            null_ll = dm.log_lik
        else:
            bs0 = None
        Ws0 = torch.zeros(P, V, dtype=torch.float64, device=dev)
        prob = Problem(data, bias, penalty, float(lam), wsum, reduce)
        bar = progress_bar(progress, max_iter, "fit_regression") if rank0 else None
        try:
            run = {"lbfgs": lbfgs, "newton": newton, "fista": prox_lbfgs}[method]
            Ws, bs, trace, n_iter, converged, gnorm = run(prob, Ws0, bs0, tol=tol, gtol=gtol,
                                                          max_iter=max_iter, bar=bar)
        finally:
            if bar is not None:
                bar.close()
        if not converged:
            warnings.warn(f"fit_regression: not converged in {n_iter} iterations (gradient "
                          f"{gnorm:.3g}, gtol {gtol:g})", RuntimeWarning, stacklevel=2)

        T0 = standardized_to_original(P, bias, mu, scale)
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
                cov = exact_cov(data, prob, Ws, bs, bias, active, T0, reduce)
                if cov is not None:
                    cov = cov.cpu()
                    se_method = "exact"
                    sd = cov.diagonal().clamp_min(0).sqrt().view(P + int(bias), V)
                    se_all[:P + int(bias)] = sd
            else:
                req = rows_for(se_for, covariate_names, bias)
                if not req:
                    warnings.warn(f"fit_regression: {n_par} coefficients exceed "
                                  f"MAX_EXACT_SE_PARAMS = {MAX_EXACT_SE_PARAMS}; standard errors "
                                  "are computed only for the covariates named in se_for (by "
                                  "conjugate gradients)", RuntimeWarning, stacklevel=2)
                else:
                    var = cg_variances(data, prob, Ws, bs, bias, req, T0, reduce, active).cpu()
                    for i, r in enumerate(req):
                        se_all[r] = var[i].clamp_min(0).sqrt()
                    se_method = "cg"
            # group lasso: zero rows have no SE
            se_all[:P][~active.cpu()] = float("nan")
        W_hat, b_hat = W_hat.cpu(), b_hat.cpu()
        est = torch.cat([W_hat, b_hat.unsqueeze(0)])
        z = est / se_all
        p = p_value(z)
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
