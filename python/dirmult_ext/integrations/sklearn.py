"""scikit-learn estimators over the package's Dirichlet-multinomial mixture
and classifier.

Import them from here (scikit-learn is imported with this module, never with
``dirmult_ext`` itself)::

    from dirmult_ext.integrations.sklearn import (
        DirichletMultinomialMixture, DirichletMultinomialClassifier)

* :class:`DirichletMultinomialMixture` is a density estimator with the API of
  :class:`sklearn.mixture.GaussianMixture` (``fit``, ``predict``,
  ``predict_proba``, ``score``, ``bic``, ``sample``, ...) over
  :func:`dirmult_ext.fit_mixture`.
* :class:`DirichletMultinomialClassifier` is a classifier over
  :class:`dirmult_ext.DMClassifier`.

``X`` is a ``(n_samples, n_features)`` matrix of non-negative integer counts
(rows: samples; columns: categories, at least 2): a numpy array, a
``scipy.sparse`` matrix or array (kept sparse: every pass reads the nonzeros
only) or a torch tensor (dense or sparse). Negative or non-integer values
raise a ``ValueError``. Both estimators work in a ``Pipeline`` and under
``GridSearchCV``; the mixture's ``score`` is the mean held-out
log-likelihood, so ``GridSearchCV(DirichletMultinomialMixture(),
{"n_components": [1, 2, 3, 4]})`` chooses the number of components by it.
"""
from __future__ import annotations

import copy
import warnings
from numbers import Integral, Real

import numpy as np
import torch

try:
    import scipy.sparse as sp
    from sklearn.base import BaseEstimator, ClassifierMixin, DensityMixin, _fit_context
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state
    from sklearn.utils._param_validation import Interval, StrOptions
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as e:
    raise ImportError("dirmult_ext.integrations.sklearn needs scikit-learn >= 1.6: install "
                      "it with `pip install 'dirmult_ext[sklearn]'` (or scikit-learn)") from e

from ..models.criteria import criteria
from ..models.classifier import DMClassifier
from ..models.mixture import fit_mixture

__all__ = ["DirichletMultinomialMixture", "DirichletMultinomialClassifier"]

# dtypes the package's kernels read as they are; any other becomes float64
# (exact for integers below 2^53)
_KEPT_DTYPES = (np.uint8, np.int32, np.int64, np.float32, np.float64)


def _torch_to_host(X: torch.Tensor):
    """A torch tensor as a numpy array or scipy CSR matrix (on the host:
    scikit-learn's validation reads numpy)."""
    X = X.detach()
    if X.dtype == torch.bfloat16:       # (numpy has no bfloat16)
        X = X.float()
    if X.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_coo):
        X = X.cpu().to_sparse_csr()
        return sp.csr_matrix((X.values().numpy(), X.col_indices().numpy(),
                              X.crow_indices().numpy()), shape=tuple(X.shape))
    return X.cpu().numpy()


def _validate_counts(est, X, *, reset: bool, y=None, method: str):
    """Validate ``X`` (and ``y``) as scikit-learn does, then as counts: a
    numpy array or CSR matrix of non-negative integers, at least 2 columns.
    Returns ``(X, y, device)`` with the device of a torch input (None for
    others)."""
    device = None
    if isinstance(X, torch.Tensor):
        device = X.device
        X = _torch_to_host(X)
    # at least 2 categories; later calls are held to fit's number of features
    kw = dict(reset=reset, accept_sparse="csr", dtype="numeric",
              ensure_min_features=2 if reset else 1)
    if y is None:
        X = validate_data(est, X, **kw)
    else:
        X, y = validate_data(est, X, y, **kw)
    vals = X.data if sp.issparse(X) else X
    if vals.dtype.kind == "b":
        vals = vals.astype(np.uint8)
    whom = f"{type(est).__name__}.{method}"
    if vals.size and vals.dtype.kind in "if" and vals.min() < 0:
        raise ValueError(f"Negative values in data passed to {whom} as X: X must hold "
                         f"non-negative integer counts, got minimum {vals.min()}")
    if vals.dtype.kind == "f" and vals.size and bool(np.any(vals != np.floor(vals))):
        bad = vals[vals != np.floor(vals)].flat[0]
        raise ValueError(f"Non-integer values in data passed to {whom} as X: X must hold "
                         f"non-negative integer counts, got {bad}")
    if vals.dtype.type not in _KEPT_DTYPES:
        vals = vals.astype(np.float64)
    if sp.issparse(X):
        if vals is not X.data:
            X = X.copy()
            X.data = vals
    else:
        X = np.ascontiguousarray(vals)
    return X, y, device


def _as_package_counts(X):
    """What the package's functions take: a tensor for a dense array (no
    copy), the scipy matrix itself for sparse."""
    if sp.issparse(X):
        return X
    with warnings.catch_warnings():
        # a read-only array (a memmap) is fine: the package never writes to counts
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(X)


class _CountsEstimator:
    """What both estimators share: count input's tags, the device to fit on."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # scikit-learn has no tag for integer input; ``categorical`` is the one
        # through which its estimator checks draw non-negative integer X (as for
        # CategoricalNB), with ``positive_only`` for the non-negativity.
        tags.input_tags.positive_only = True
        tags.input_tags.categorical = True
        tags.input_tags.sparse = True
        return tags

    def _device(self, input_device):
        return self.device if self.device is not None else input_device


class DirichletMultinomialMixture(_CountsEstimator, DensityMixin, BaseEstimator):
    """Dirichlet-multinomial mixture (Holmes, Harris & Quince 2012) fitted by
    EM: :func:`dirmult_ext.fit_mixture` with scikit-learn's mixture API
    (as :class:`sklearn.mixture.GaussianMixture`).

    Row ``x`` comes from component ``k`` with probability ``weights_[k]``,
    then ``x ~ DM(N, concentrations_[k])`` with ``N`` its total. Every
    log-likelihood is of the normalized pmf (multinomial coefficient
    included), so ``score`` and ``score_samples`` compare across models.

    Parameters
    ----------
    n_components : int, default=1
        Number of mixture components.
    n_init : int, default=3
        Full EM runs; the one with the highest log-likelihood is kept.
        They start from the best ``n_init`` of ``n_screen`` short runs.
    max_iter : int, default=200
        EM iterations per run.
    tol : float, default=1e-6
        A run stops when the log-likelihood changes by at most
        ``tol * |log-likelihood|`` between iterations (a relative change,
        unlike GaussianMixture's absolute change of the per-sample bound).
    random_state : int, RandomState instance or None, default=None
        Seeds the initializations (and ``sample``).
    init_params : {'k-means++', 'random'}, default='k-means++'
        Initial responsibilities: k-means++ seeds on the row proportions
        (each row assigned to its nearest seed, softened), or Dirichlet(1)
        draws.
    warm_start : bool, default=False
        If True, a later ``fit`` starts from the previous fit: one EM run
        from the responsibilities the previous parameters give the new X
        (``n_init`` and ``n_screen`` are then not used).
    verbose : int, default=0
        0: silent; 1: a line per fit; 2: also a progress bar over EM
        iterations (needs ``tqdm``).
    n_screen : int, default=20
        Short runs (10 EM iterations each, from their own seeds) among which
        the ``n_init`` starts are chosen; ``n_screen <= n_init``: ``n_init``
        runs from fresh seeds.
    min_alpha : float, default=1e-6
        Lower bound for the concentrations.
    device : str, torch.device or None, default=None
        Where to compute (e.g. ``"cuda"``); None: the device of a torch
        input, else the CPU.

    Attributes
    ----------
    weights_ : ndarray of shape (n_components,)
        Mixing proportions, decreasing.
    concentrations_ : ndarray of shape (n_components, n_features)
        Dirichlet concentrations (alpha) of each component.
    converged_ : bool
        Whether the best run met ``tol``.
    n_iter_ : int
        EM iterations of the best run.
    lower_bound_ : float
        Log-likelihood per sample of the training data at the fit (EM's
        objective, which it maximizes exactly: there is no looser bound).
    lower_bounds_ : ndarray
        ``lower_bound_`` after each EM iteration of the best run, one entry an
        iteration (non-decreasing: EM never lowers it).
    mixture_ : dirmult_ext.DMMixture
        The package's fit (training responsibilities, the Laplace
        criterion, the objective's trace, every run's final value).
    n_features_in_ : int
        Number of features (categories) seen in ``fit``.
    feature_names_in_ : ndarray of shape (n_features,)
        Their names, when X has string column names.
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "random_state": ["random_state"],
        "init_params": [StrOptions({"k-means++", "random"})],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "n_screen": [Interval(Integral, 0, None, closed="left")],
        "min_alpha": [Interval(Real, 0.0, 1.0, closed="neither")],
        "device": [None, str, torch.device],
    }

    def __init__(self, n_components=1, *, n_init=3, max_iter=200, tol=1e-6,
                 random_state=None, init_params="k-means++", warm_start=False,
                 verbose=0, n_screen=20, min_alpha=1e-6, device=None):
        self.n_components = n_components
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.init_params = init_params
        self.warm_start = warm_start
        self.verbose = verbose
        self.n_screen = n_screen
        self.min_alpha = min_alpha
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the mixture to the counts ``X``; ``y`` is ignored.

        Returns
        -------
        self : DirichletMultinomialMixture
        """
        warm = self.warm_start and hasattr(self, "mixture_")
        X, _, dev = _validate_counts(self, X, reset=not warm, method="fit")
        n = X.shape[0]
        if n < self.n_components:
            raise ValueError(f"Expected n_samples >= n_components but got n_components = "
                             f"{self.n_components}, n_samples = {n}")
        dev = self._device(dev)
        counts = _as_package_counts(X)
        if warm:
            if self.mixture_.n_components != self.n_components:
                raise ValueError(f"warm_start needs the previous fit's n_components "
                                 f"({self.mixture_.n_components}), got {self.n_components}")
            init = self.mixture_.predict_proba(counts, device=dev)
        else:
            init = "kmeans++" if self.init_params == "k-means++" else "random"
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        m = fit_mixture(counts, int(self.n_components), n_init=int(self.n_init),
                        max_iter=int(self.max_iter), tol=self.tol, seed=seed,
                        progress=self.verbose >= 2, device=dev, init=init,
                        n_screen=int(self.n_screen), min_alpha=self.min_alpha)
        self.mixture_ = m
        self.weights_ = m.weights.numpy()
        self.concentrations_ = m.alpha.numpy()
        self.converged_ = bool(m.converged)
        self.n_iter_ = int(m.n_iter)
        self.lower_bound_ = float(m.log_lik) / n
        self.lower_bounds_ = np.asarray(m.log_lik_trace, dtype=np.float64) / n
        # the training rows' totals: ``sample``'s default totals
        self._row_totals = np.asarray(X.sum(axis=1)).ravel().astype(np.int64)
        if self.verbose >= 1:
            print(f"{type(self).__name__}: {self.n_components} components, "
                  f"{self.n_iter_} EM iterations, converged: {self.converged_}, "
                  f"log-likelihood per sample {self.lower_bound_:.6g}")
        if not self.converged_:
            warnings.warn(f"The best EM run did not converge in {self.max_iter} iterations "
                          f"(tol={self.tol}): raise max_iter or tol.", ConvergenceWarning)
        return self

    def fit_predict(self, X, y=None):
        """Fit, then the most probable component of each training row.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return self.fit(X, y).predict(X)

    def _joint(self, X, method):
        check_is_fitted(self)
        X, _, dev = _validate_counts(self, X, reset=False, method=method)
        return self.mixture_.joint_log_lik(_as_package_counts(X), device=self._device(dev))

    def predict(self, X):
        """Most probable component of each row.

        Returns
        -------
        labels : ndarray of shape (n_samples,), int64
        """
        return self._joint(X, "predict").argmax(-1).cpu().numpy()

    def predict_proba(self, X):
        """Posterior probability of each component for each row.

        Returns
        -------
        resp : ndarray of shape (n_samples, n_components)
        """
        return torch.softmax(self._joint(X, "predict_proba"), -1).cpu().numpy()

    def score_samples(self, X):
        """Log-likelihood of each row under the mixture (normalized pmf).

        Returns
        -------
        log_prob : ndarray of shape (n_samples,)
        """
        return torch.logsumexp(self._joint(X, "score_samples"), -1).cpu().numpy()

    def score(self, X, y=None):
        """Mean log-likelihood per row of ``X``; ``y`` is ignored.

        Returns
        -------
        log_likelihood : float
        """
        return float(self.score_samples(X).mean())

    def _criteria(self, X, method):
        ll = self.score_samples(X)
        K, V = self.concentrations_.shape
        # no prior: dmn's NLE is -log-likelihood (log_det enters only Laplace)
        return criteria(float(ll.sum()), 0.0, 0.0, K, V, ll.shape[0])

    def bic(self, X):
        """Bayesian information criterion on ``X`` (lower is better).

        The package's definition (:mod:`dirmult_ext.models.criteria`, as
        Bioconductor's ``dmn``): ``-log L + p/2 log n`` with
        ``p = K V + K - 1`` and ``n`` the rows of ``X``: half the
        ``-2 log L + p log n`` scale of GaussianMixture's ``bic``. On the
        training data it equals ``mixture_.bic``.

        Returns
        -------
        bic : float
        """
        return self._criteria(X, "bic")["bic"]

    def aic(self, X):
        """Akaike information criterion on ``X`` (lower is better):
        ``-log L + p``, half the ``-2 log L + 2 p`` scale (see :meth:`bic`).

        Returns
        -------
        aic : float
        """
        return self._criteria(X, "aic")["aic"]

    def sample(self, n_samples=1, n_trials=None):
        """Draw count vectors from the fitted mixture.

        Parameters
        ----------
        n_samples : int, default=1
        n_trials : int, array of shape (n_samples,) or None, default=None
            Total count of each drawn row; None: drawn from the training
            rows' totals.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features), int64
            Rows grouped by component, as GaussianMixture returns them.
        y : ndarray of shape (n_samples,)
            Component of each row.
        """
        check_is_fitted(self)
        if isinstance(n_samples, bool) or not isinstance(n_samples, Integral) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        rng = check_random_state(self.random_state)
        if n_trials is None:
            totals = rng.choice(self._row_totals, n_samples)
        else:
            totals = np.broadcast_to(np.asarray(n_trials), (n_samples,))
            if (totals.dtype.kind not in "iuf" or bool(np.any(totals < 0))
                    or bool(np.any(totals != np.floor(totals)))):
                raise ValueError(f"n_trials must hold non-negative integers, got {n_trials!r}")
            totals = totals.astype(np.int64)
        w = self.weights_ / self.weights_.sum()
        per_comp = rng.multinomial(n_samples, w)
        y = np.repeat(np.arange(len(w)), per_comp)
        # Generator.dirichlet stays finite for concentrations far below 1
        gen = np.random.default_rng(rng.randint(np.iinfo(np.int32).max))
        p = np.concatenate([gen.dirichlet(a, size=int(c))
                            for a, c in zip(self.concentrations_, per_comp)])
        p /= p.sum(-1, keepdims=True)
        return gen.multinomial(totals, p).astype(np.int64), y


class DirichletMultinomialClassifier(_CountsEstimator, ClassifierMixin, BaseEstimator):
    """Class-conditional Dirichlet-multinomial classifier:
    :class:`dirmult_ext.DMClassifier` as a scikit-learn classifier.

    One DM per class (maximum likelihood on that class's rows) and a class
    prior; ``predict`` picks argmax_c log prior_c + log DM(x | alpha_c).

    Parameters
    ----------
    prior : {'empirical', 'uniform'}, default='empirical'
        Class prior: the training class frequencies, or uniform.
    min_alpha : float, default=1e-3
        Lower bound for the concentrations: a category never seen in a
        class's training rows costs about log(min_alpha) per count.
    method : {'newton', 'fixed_point'}, default='newton'
        Optimizer of each class's concentrations (:func:`dirmult_ext.fit`).
    tol : float, default=1e-8
    max_iter : int, default=200
    device : str, torch.device or None, default=None
        Where to compute; None: the device of a torch input, else the CPU.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The sorted class labels (any type ``np.unique`` sorts).
    concentrations_ : ndarray of shape (n_classes, n_features)
        Each class's concentrations (alpha).
    class_log_prior_ : ndarray of shape (n_classes,)
    converged_ : ndarray of shape (n_classes,), bool
    n_iter_ : int
        Optimizer iterations (the classes are fitted together).
    classifier_ : dirmult_ext.DMClassifier
        The package's fitted classifier (on class indices 0..n_classes-1).
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features,)
    """

    _parameter_constraints: dict = {
        "prior": [StrOptions({"empirical", "uniform"})],
        "min_alpha": [Interval(Real, 0.0, 1.0, closed="neither")],
        "method": [StrOptions({"newton", "fixed_point"})],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "device": [None, str, torch.device],
    }

    def __init__(self, *, prior="empirical", min_alpha=1e-3, method="newton", tol=1e-8,
                 max_iter=200, device=None):
        self.prior = prior
        self.min_alpha = min_alpha
        self.method = method
        self.tol = tol
        self.max_iter = max_iter
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y):
        """Fit one DM per class of ``y`` to the counts ``X``.

        Returns
        -------
        self : DirichletMultinomialClassifier
        """
        X, y, dev = _validate_counts(self, X, y=y, reset=True, method="fit")
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        clf = DMClassifier(prior=self.prior, min_alpha=self.min_alpha, method=self.method,
                           tol=self.tol, max_iter=int(self.max_iter), device=self._device(dev))
        self.classifier_ = clf.fit(_as_package_counts(X), codes)
        self.concentrations_ = clf.log_alpha_.exp().numpy()
        self.class_log_prior_ = clf.log_prior_.numpy()
        self.converged_ = clf.converged_.numpy()
        self.n_iter_ = clf.n_iter_
        return self

    def _log_proba(self, X, method):
        check_is_fitted(self)
        X, _, dev = _validate_counts(self, X, reset=False, method=method)
        clf = copy.copy(self.classifier_)     # the fitted one keeps its device
        clf.device = self._device(dev)
        return clf.predict_log_proba(_as_package_counts(X))

    def predict_log_proba(self, X):
        """Log posterior probability of each class (columns in ``classes_``
        order).

        Returns
        -------
        log_proba : ndarray of shape (n_samples, n_classes)
        """
        return self._log_proba(X, "predict_log_proba").cpu().numpy()

    def predict_proba(self, X):
        """Posterior probability of each class.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
        """
        return self._log_proba(X, "predict_proba").exp().cpu().numpy()

    def predict(self, X):
        """The most probable class of each row.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        idx = self._log_proba(X, "predict").argmax(-1).cpu().numpy()
        return self.classes_[idx]
