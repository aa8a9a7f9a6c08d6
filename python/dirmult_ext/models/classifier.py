"""The class-conditional Dirichlet-multinomial classifier: one DM per class,
fitted together as K weighted fits on the fitting engine, with class priors."""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..data.threads import fit_threads
from .arg_checks import check_labels
from ..data.counts import as_counts
from .engine import (Rows, check_common, component_log_lik, moment_init, optimize,
                     prepass, resolve_device)

__all__ = ["DMClassifier"]


class DMClassifier:
    """Class-conditional Dirichlet-multinomial classifier: one DM per class
    (maximum likelihood on that class's rows, all classes fitted together)
    and a class prior; ``predict`` picks argmax_c log prior_c + log DM(n | alpha_c).

    Args:
        prior: ``"empirical"`` (class frequencies) or ``"uniform"``.
        min_alpha: lower bound for the concentrations: a category never seen
            in a class's training rows costs about log(min_alpha) per count.
        method, tol, max_iter: as :func:`dirmult_ext.fit`.
        device: where to fit and predict (default the counts' device).

    After :meth:`fit`: ``classes_`` (numpy, sorted unique labels),
    ``log_alpha_`` ``(C, V)`` and ``log_prior_`` ``(C,)`` float64 CPU tensors,
    ``converged_`` ``(C,)`` bools, ``n_iter_`` the iterations taken (all
    classes fitted together).
    """

    def __init__(self, *, prior: str = "empirical", min_alpha: float = 1e-3,
                 method: str = "newton", tol: float = 1e-8, max_iter: int = 200,
                 device=None):
        if prior not in ("empirical", "uniform"):
            raise ValueError(f"prior must be 'empirical' or 'uniform', got {prior!r}")
        check_common(method, tol, max_iter, min_alpha)
        self.prior, self.min_alpha, self.method = prior, min_alpha, method
        self.tol, self.max_iter, self.device = tol, max_iter, device

    def fit(self, counts, labels) -> "DMClassifier":
        counts = as_counts(counts)
        lab = check_labels(labels, counts.shape[0])
        self.classes_, codes = np.unique(lab, return_inverse=True)
        C = len(self.classes_)
        dev = resolve_device(counts, self.device)
        Y = torch.nn.functional.one_hot(torch.as_tensor(codes, dtype=torch.int64), C)
        rows = Rows(counts, Y.to(torch.float64), dev, None)
        with fit_threads(counts.shape[0] * counts.shape[1] * C, dev):  # Note [Fit threads]
            pre = prepass(rows)
            eta0 = moment_init(pre, self.min_alpha)
            eta, _, _, n_iter, conv, _ = optimize(
                rows, eta0, pre, method=self.method, tol=self.tol,
                gtol=0.01 * math.sqrt(self.tol), max_iter=self.max_iter,
                min_alpha=self.min_alpha)
        self.log_alpha_ = eta.detach().cpu()
        n = Y.sum(0).to(torch.float64)
        self.log_prior_ = ((n / n.sum()).log() if self.prior == "empirical"
                           else torch.full((C,), -math.log(C), dtype=torch.float64))
        self.converged_ = conv.cpu()
        self.n_iter_ = int(n_iter)
        return self

    def _joint(self, counts) -> Tensor:
        if not hasattr(self, "log_alpha_"):
            raise RuntimeError("DMClassifier is not fitted; call fit(counts, labels) first")
        ll = component_log_lik(counts, self.log_alpha_, self.device)
        return ll + self.log_prior_.to(ll.device)

    def predict_log_proba(self, counts) -> Tensor:
        """``(B, C)`` log posterior class probabilities."""
        return torch.log_softmax(self._joint(counts), -1)

    def predict_proba(self, counts) -> Tensor:
        return self.predict_log_proba(counts).exp()

    def predict(self, counts) -> np.ndarray:
        """``(B,)`` predicted labels (elements of ``classes_``)."""
        idx = self._joint(counts).argmax(-1).cpu().numpy()
        return self.classes_[idx]

    def score(self, counts, labels) -> float:
        """Accuracy on labelled rows."""
        return float((self.predict(counts) == np.asarray(labels).ravel()).mean())
