r"""Dirichlet-multinomial mixtures (Holmes, Harris & Quince 2012, "Dirichlet
multinomial mixtures", PLoS ONE 7(2): e30126) fitted by EM.

Model: row b comes from component k with probability pi_k, and then
n_b ~ DM(alpha_k). EM on

    log p(counts) = sum_b logsumexp_k [log pi_k + log DM(n_b | alpha_k)]

* E-step: ``log_lik_components`` gives the (B, K) matrix of log DM(n_b |
  alpha_k) in one pass; responsibilities r_bk = softmax_k(log pi_k + ...),
  in log space.
* M-step: pi_k = sum_b r_bk / B; alpha_k by one weighted Newton step
  (weights r_bk) from the previous alpha_k (:mod:`dirmult_ext.models.engine`), all K
  components together; the E-step and the statistics of that step share one
  pass over the rows (see ``_em_run``).

Restarts (Note [Mixture restarts]): ``n_screen`` short runs from k-means++
seeds on the row proportions (or random responsibilities), the best
``n_init`` of them run to convergence, the best final objective wins.

Optionally (``prior=``) the MAP estimate under ``dmn``'s Gamma prior on the
concentrations. Criteria (Laplace, BIC, AIC) are defined as ``dmn``'s, on half
the usual scale: formulas in :mod:`dirmult_ext.models.criteria`. For k >= 2
the Laplace value is not dmn's number: dmn leaves two per-row sums of its
Hessian unweighted by the responsibilities, this package weights them (the
Hessian of the objective the M-step maximizes); on a real microbiome table
the two differ by +0.2 to -267 for k = 2..7.
:func:`~dirmult_ext.models.dmn_compat.dmn_laplace` gives dmn's number.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, NamedTuple, Optional, Union

import numpy as np
import torch
from torch import Tensor

from .criteria import (GammaPrior, ModelSelection, add_prior, criteria, hessian_parts,
                       log_det_hessian, resolve_prior)
from ..data.counts import as_counts
from .engine import (HALVINGS, MAX_ALPHA, Reducer, Rows, check_common, component_log_lik,
                     default_progress, fixed_point_step, identity, moment_init, newton_step, optimize,
                     prepass, resolve_device, row_stats)
from .arg_checks import check_k, check_seed
from .progress import progress_bar
from .starts import kmeanspp, random_responsibilities
from ..data.threads import fit_threads

__all__ = ["fit_mixture", "DMMixture", "best_run", "mixture_result", "check_mixture_args"]


# ---------------------------------------------------------------------------
# mixture
# ---------------------------------------------------------------------------
@dataclass
class DMMixture:
    """A fitted K-component DM mixture (:func:`fit_mixture`); float64 CPU tensors.

    Attributes:
        weights: ``(K,)`` mixing proportions pi.
        log_alpha: ``(K, V)`` component log-concentrations.
        log_lik: total log-likelihood of the training rows (normalized pmf).
        laplace, bic, aic: the criteria as ``dmn`` defines them (lower is
            better; for k >= 2 the Laplace Hessian's per-row terms weighted
            by the responsibilities, unlike dmn's: module docstring; formulas in
            :mod:`dirmult_ext.models.criteria`): NLE + 1/2 log det H - p/2 log(2 pi),
            NLE + p/2 log B, NLE + p, with NLE = -(log_lik + log_prior) and
            p = K V + K - 1.
        log_prior: the log prior density of ``log_alpha`` (0 without a prior).
        prior: the :class:`~dirmult_ext.models.criteria.GammaPrior` fitted under, or None.
        n_iter: EM iterations of the best restart.
        converged: whether that restart met ``tol``.
        responsibilities: ``(B, K)`` posterior component probabilities of the
            training rows.
        log_lik_trace: the objective after each E-step of the best restart
            (the log-likelihood; with a prior, plus ``log_prior``).
        restart_log_liks: the final objective of every restart.
        iter_s: seconds per EM iteration of the best restart.
    """
    weights: Tensor
    log_alpha: Tensor
    log_lik: float
    bic: float
    aic: float
    n_iter: int
    converged: bool
    responsibilities: Tensor = field(repr=False)
    log_lik_trace: List[float] = field(default_factory=list, repr=False)
    restart_log_liks: List[float] = field(default_factory=list)
    laplace: float = float("nan")
    log_prior: float = 0.0
    prior: Optional[GammaPrior] = None
    hessian_diag: Optional[Tensor] = field(default=None, repr=False)
    hessian_rank_one: Optional[Tensor] = field(default=None, repr=False)
    iter_s: float = field(default=float("nan"), repr=False)

    def hessian_blocks(self) -> Tensor:
        """``(K, V, V)`` float64: block k is the Hessian of component k's
        negative weighted log posterior in log alpha_k (responsibilities
        fixed), diag(h_k) + c_k alpha_k alpha_k^T, the blocks of dmn's
        Laplace term (:mod:`dirmult_ext.models.criteria`)."""
        a = self.alpha
        return (torch.diag_embed(self.hessian_diag)
                + self.hessian_rank_one[:, None, None] * a[:, :, None] * a[:, None, :])

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.exp()

    @property
    def n_components(self) -> int:
        return self.log_alpha.shape[0]

    def joint_log_lik(self, counts, device=None, batch_size=None) -> Tensor:
        """``(B, K)`` log pi_k + log DM(counts[b] | alpha_k), float64."""
        ll = component_log_lik(counts, self.log_alpha, device, batch_size)
        return ll + self.weights.to(ll.device).log()

    def log_prob(self, counts, device=None) -> Tensor:
        """``(B,)`` mixture log-likelihood of each row (normalized pmf)."""
        return torch.logsumexp(self.joint_log_lik(counts, device), -1)

    def predict_proba(self, counts, device=None) -> Tensor:
        """``(B, K)`` posterior component probabilities."""
        return torch.softmax(self.joint_log_lik(counts, device), -1)

    def predict(self, counts, device=None) -> Tensor:
        """``(B,)`` int64 most probable component per row."""
        return self.joint_log_lik(counts, device).argmax(-1)


class _EStep:
    """The fused E-step: turns each batch's (b, K) component log-likelihoods
    into responsibilities, accumulating the total log-likelihood and, for
    the acceptance test of the previous M-step, Q_k = sum_b r_old_bk ll_bk
    under the responsibilities that M-step used."""

    def __init__(self, log_pi: Tensor, B: int):
        self.log_pi = log_pi
        self.R = torch.empty(B, log_pi.shape[0], dtype=torch.float64, device=log_pi.device)
        self.total = torch.zeros((), dtype=torch.float64, device=log_pi.device)
        self.q_old = torch.zeros_like(log_pi)

    def __call__(self, start: int, ll: Tensor, w_old: Tensor) -> Tensor:
        j = ll + self.log_pi
        lse = torch.logsumexp(j, -1, keepdim=True)
        r = (j - lse).exp()
        self.R[start:start + r.shape[0]] = r
        self.total += lse.sum()
        self.q_old += (w_old * ll).sum(0)
        return r


def _log_pi(R: Tensor, reduce: Reducer = identity) -> Tensor:
    W = reduce(R.sum(0))
    return (W / W.sum()).clamp_min(1e-300).log()


class _Run(NamedTuple):
    """One EM run: parameters and responsibilities at its end, the objective
    after each E-step, the statistics of its last pass (at eta, weighted by
    R) and the seconds its EM iterations took (the start's fit left out)."""
    eta: Tensor
    log_pi: Tensor
    R: Tensor
    trace: List[float]
    n_iter: int
    converged: bool
    log_lik: float
    S: object
    em_s: float


def _em_run(rows: Rows, R: Tensor, *, max_iter: int, tol: float, m_steps: int,
            min_alpha: float, bar=None, run: int = 0, prior: Optional[GammaPrior] = None,
            reduce: Reducer = identity) -> _Run:
    """EM from initial responsibilities R (B, K). Each iteration is one pass
    over the rows: component log-likelihoods with their gradient (the fused
    op), responsibilities from them, and the M-step statistics under the new
    responsibilities; then pi exactly and one Newton step (Minka fixed point
    where the Hessian is not negative definite) per component. A step that
    lowers Q_k (checked in the next pass) is halved, then replaced by the
    fixed-point step, so the likelihood never decreases (generalized EM).
    With a prior the objective is the log posterior and the steps are those
    of the penalized statistics (``criteria.add_prior``). Every sum over
    rows goes through ``reduce`` (the sum over ranks of a distributed fit),
    so every decision is taken on the whole data's statistics."""
    lo, hi = math.log(min_alpha), math.log(MAX_ALPHA)
    rows.set_weights(R)
    pre = prepass(rows, reduce, check=False)
    eta = moment_init(pre, min_alpha)
    eta, *_ = optimize(rows, eta, pre, method="newton", tol=0.0, gtol=0.0,
                        max_iter=m_steps, min_alpha=min_alpha, need_converged=False,
                        reduce=reduce)
    log_pi = _log_pi(R, reduce)
    c_sum = float(reduce(rows.c.sum().reshape(1))[0])
    K = eta.shape[0]
    trace: List[float] = []
    S_prev = eta_prev = nt = fp = use_newton = t = None
    converged, it, retries = False, 0, 0
    t0 = time.perf_counter()
    while it < max_iter:
        est = _EStep(log_pi, rows.B)
        S = row_stats(rows, eta, None, True, reduce=reduce, reweight=est.__call__)
        tq = reduce(torch.cat([est.total.reshape(1), est.q_old]))
        est.total, est.q_old = tq[0], tq[1:].clone()
        lp = 0.0
        if prior is not None:
            add_prior(S, eta, prior)
            est.q_old += prior.log_density(eta)
            lp = float(prior.log_density(eta).sum())
        if S_prev is not None and retries < HALVINGS + 1:
            bad = est.q_old < S_prev.L - 1e-12 * S_prev.L.abs() - 1e-12
            bad &= use_newton
            if bool(bad.any()):
                retries += 1
                t[bad] *= 0.5
                use_newton[bad] &= t[bad] >= 0.5 ** HALVINGS
                step = torch.where(use_newton.unsqueeze(-1), t.unsqueeze(-1) * nt, fp)
                eta = torch.where(bad.unsqueeze(-1), (eta_prev + step).clamp(lo, hi), eta)
                continue
        it += 1
        retries = 0
        log_lik = float(est.total) + c_sum
        ll = log_lik + lp
        trace.append(ll)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(restart=run, log_lik=f"{ll:.6g}")
        if len(trace) > 1 and abs(trace[-1] - trace[-2]) <= tol * abs(ll):
            converged = True
            break
        if it == max_iter:
            break
        # M-step under the new responsibilities
        rows.set_weights(est.R)
        log_pi = _log_pi(est.R, reduce)
        free = (eta > lo + 1e-9) | (S.G > 0)
        nt, use_newton = newton_step(eta, S, free)
        fp = fixed_point_step(eta, S)
        t = torch.ones(K, dtype=torch.float64, device=eta.device)
        eta_prev, S_prev = eta, S
        eta = (eta + torch.where(use_newton.unsqueeze(-1), nt, fp)).clamp(lo, hi)
    return _Run(eta, log_pi, est.R, trace, it, converged, log_lik, S,
                time.perf_counter() - t0)


def best_run(rows: Rows, k: int, start: Callable[[int], Tensor], *, n_init: int,
              n_screen: int, screen_iter: int, bar=None, reduce: Reducer = identity,
              **em) -> tuple:
    """The restarts of Note [Mixture restarts]: ``start(i)`` gives the i-th
    seed's initial responsibilities. Returns (best run, every restart's final
    objective)."""
    starts = []
    if n_screen > n_init and k > 1:
        # short runs from many seeds; the best n_init go on to convergence
        screened = []
        for i in range(n_screen):
            out = _em_run(rows, start(i), **dict(em, max_iter=screen_iter), reduce=reduce)
            screened.append((out.trace[-1], out.R))
        screened.sort(key=lambda t: -t[0])
        starts = [R for _, R in screened[:n_init]]
    best, finals = None, []
    for run in range(n_init):
        out = _em_run(rows, starts[run] if starts else start(run), bar=bar, run=run,
                      reduce=reduce, **em)
        finals.append(out.trace[-1])
        if best is None or out.trace[-1] > best.trace[-1]:
            best = out
    return best, finals


def mixture_result(best: _Run, finals: List[float], k: int, V: int, B: int,
                    prior: Optional[GammaPrior], reduce: Reducer = identity) -> DMMixture:
    """The DMMixture of the best run: components by decreasing weight,
    dmn's criteria (``B`` the rows of all ranks)."""
    eta = best.eta.detach()
    lp = 0.0 if prior is None else float(prior.log_density(eta).sum())
    h, c = hessian_parts(best.S, eta)
    # components by decreasing weight (dmn's weight term leaves out the first)
    order = torch.argsort(-best.log_pi, stable=True)
    eta, log_pi, R, h, c = eta[order], best.log_pi[order], best.R[:, order], h[order], c[order]
    log_det = log_det_hessian(h, c, eta, reduce(R.sum(0)), B)
    crit = criteria(best.log_lik, lp, log_det, k, V, B)
    return DMMixture(weights=log_pi.exp().cpu(), log_alpha=eta.cpu(), log_lik=best.log_lik,
                     bic=crit["bic"], aic=crit["aic"], laplace=crit["laplace"],
                     log_prior=lp, prior=prior, hessian_diag=h.cpu(),
                     hessian_rank_one=c.cpu(), n_iter=best.n_iter,
                     converged=best.converged, responsibilities=R.cpu(),
                     log_lik_trace=best.trace, restart_log_liks=finals,
                     iter_s=best.em_s / max(best.n_iter, 1))


def check_mixture_args(k, n_init, n_screen, screen_iter, init, m_steps, tol, max_iter,
                        min_alpha) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not isinstance(n_init, int) or n_init < 1:
        raise ValueError(f"n_init must be a positive integer, got {n_init!r}")
    if not isinstance(n_screen, int) or n_screen < 0:
        raise ValueError(f"n_screen must be a non-negative integer, got {n_screen!r}")
    if not isinstance(screen_iter, int) or screen_iter < 1:
        raise ValueError(f"screen_iter must be a positive integer, got {screen_iter!r}")
    if init not in ("kmeans++", "random"):
        raise ValueError(f"init must be 'kmeans++' or 'random', got {init!r}")
    if not isinstance(m_steps, int) or m_steps < 1:
        raise ValueError(f"m_steps must be a positive integer, got {m_steps!r}")
    check_common("newton", tol, max_iter, min_alpha)


def _initial_responsibilities(init, B: int, k: int, device) -> Tensor:
    """``init`` as (B, k) float64 responsibilities on ``device``, checked."""
    R = torch.as_tensor(np.asarray(init.detach().cpu() if isinstance(init, Tensor) else init,
                                   dtype=np.float64))
    if R.shape != (B, k):
        raise ValueError(f"init responsibilities must have shape ({B}, {k}), "
                         f"got {tuple(R.shape)}")
    if not bool(torch.isfinite(R).all()) or bool((R < 0).any()) or not torch.allclose(
            R.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-6):
        raise ValueError("init responsibilities must be non-negative with rows summing to 1")
    return R.to(device)


def fit_mixture(counts, k: Union[int, Iterable[int]], *, n_init: int = 3,
                max_iter: int = 200, tol: float = 1e-6, seed: Optional[int] = None,
                progress: Optional[bool] = None, device=None, init="kmeans++",
                m_steps: int = 2, batch_size: Optional[int] = None,
                min_alpha: float = 1e-6, prior=None, n_screen: int = 20,
                screen_iter: int = 10) -> Union[DMMixture, ModelSelection]:
    """Fit a K-component Dirichlet-multinomial mixture by EM.

    Args:
        counts: ``(B, V)`` non-negative counts (tensor or numpy array; the
            sparse forms and the RowSource :func:`dirmult_ext.fit` takes).
        k: number of components (>= 1), or several (``range(1, 8)``): each
            is fitted (with the same ``seed``) and a
            :class:`~dirmult_ext.models.criteria.ModelSelection` is returned, with
            the fits, the table of log-likelihood, Laplace, BIC and AIC, and
            the k the Laplace criterion picks (as ``dmn`` users choose).
        n_init: full EM runs; the one with the highest objective is returned.
        n_screen, screen_iter: the runs start from the best ``n_init`` of
            ``n_screen`` short runs (``screen_iter`` EM iterations each, from
            their own seeds); ``n_screen <= n_init``: ``n_init`` runs from
            fresh seeds. See Note [Mixture restarts].
        max_iter: EM iterations per restart.
        tol: stop when the log-likelihood changes by at most
            ``tol * |log L|`` between E-steps.
        seed: seeds the initializations (a ``torch.Generator``); None: random.
        progress: report the EM iterations on stderr (a tqdm bar, or plain
            lines without tqdm): True from the start, False never, None
            (default) on a terminal once the fit has taken 2 s.
        device: where to compute (default ``counts.device``).
        init: ``"kmeans++"`` (seeds on the row proportions, hard assignment
            softened), ``"random"`` (Dirichlet(1) responsibilities,
            :func:`random_responsibilities` of restart i's stream), or a
            ``(B, k)`` array of initial responsibilities (rows summing to 1,
            e.g. a previous fit's ``predict_proba``): one EM run from them,
            ``n_init`` and ``n_screen`` ignored (the same start gives the
            same run).
        m_steps: Newton iterations of the first M-step, after the initial
            responsibilities (later M-steps take one warm-started step).
        batch_size: stream the rows in batches (see :func:`dirmult_ext.fit`:
            pinned and overlapped from host memory to CUDA; chosen
            automatically when host counts exceed half the free device memory).
        min_alpha: lower bound for the concentrations; keeps a component
            from assigning probability ~0 to counts it has not seen yet.
        prior: ``None`` (default): maximum likelihood. ``"dmn"``: the MAP
            estimate under ``DirichletMultinomial::dmn``'s Gamma(0.1, 0.1)
            prior on each alpha, in log alpha; or a ``(shape, rate)`` pair.
            The prior enters the criteria through NLE and the Hessian
            (:mod:`dirmult_ext.models.criteria`); with ``"dmn"`` the fit,
            log-likelihood, BIC and AIC are dmn's, and so is the Laplace
            criterion for k = 1; for k >= 2 dmn's Laplace leaves per-row
            terms unweighted by the responsibilities (a difference of up to
            a few hundred), which this package weights:
            :func:`~dirmult_ext.models.dmn_compat.dmn_laplace` gives dmn's
            value for comparison.

    Returns:
        :class:`DMMixture` (float64, CPU; components by decreasing weight),
        or a ModelSelection for several k.
    """
    k = check_k(k)
    seed = check_seed(seed)
    if isinstance(k, list):
        ks = k
        kw = dict(n_screen=n_screen, screen_iter=screen_iter, n_init=n_init, max_iter=max_iter, tol=tol, seed=seed, progress=progress,
                  device=device, init=init, m_steps=m_steps, batch_size=batch_size,
                  min_alpha=min_alpha, prior=prior)
        counts = as_counts(counts)
        if max(ks) > counts.shape[0]:
            raise ValueError(f"k={max(ks)} components need at least {max(ks)} rows, "
                             f"got {counts.shape[0]}")
        # one thread count for the whole table of fits (See Note [Fit threads])
        with fit_threads(counts.shape[0] * counts.shape[1] * max(ks), resolve_device(
                counts, device)):
            return ModelSelection(fits=[fit_mixture(counts, kk, **kw) for kk in ks], ks=ks)
    # (an array of initial responsibilities is checked against the counts below)
    check_mixture_args(k, n_init, n_screen, screen_iter,
                       init if isinstance(init, str) else "random", m_steps, tol, max_iter,
                       min_alpha)
    k = int(k)
    prior = resolve_prior(prior)
    counts = as_counts(counts)
    B, V = counts.shape
    if B < k:
        raise ValueError(f"k={k} components need at least {k} rows, got {B}")
    dev = resolve_device(counts, device)
    with fit_threads(B * V * k, dev):  # See Note [Fit threads]
        rows = Rows(counts, None, dev, batch_size)
        prepass(rows)                          # validates; sets rows.N, rows.c
        gen = torch.Generator()
        gen.manual_seed(int(seed) if seed is not None else int(torch.seed() % (2 ** 63)))
        if not isinstance(init, str):
            R0 = _initial_responsibilities(init, B, k, dev)
            n_init, n_screen = 1, 0

            def start(i):
                return R0
        elif init == "kmeans++":
            def start(i):
                return kmeanspp(rows, k, gen)
        else:
            base = gen.initial_seed()

            def start(i):
                return random_responsibilities(0, B, k, base, i, dev)
        bar = progress_bar(default_progress(progress, B * V * k * n_init, rows.streaming),
                           n_init * max_iter, f"fit_mixture k={k}")
        try:
            best, finals = best_run(rows, k, start, n_init=n_init, n_screen=n_screen,
                                     screen_iter=screen_iter, bar=bar, max_iter=max_iter,
                                     tol=tol, m_steps=m_steps, min_alpha=min_alpha, prior=prior)
        finally:
            if bar is not None:
                bar.close()
        return mixture_result(best, finals, k, V, B, prior)
