"""The scikit-learn estimators (dirmult_ext.integrations.sklearn): scikit-learn's
own estimator checks, Pipeline and GridSearchCV, agreement with the package's
fits and with a float64 gammaln reference, sparse, torch and bad input."""
import math
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the estimators need scikit-learn (extra 'sklearn')")

import scipy.sparse as sp  # noqa: E402
import torch  # noqa: E402
from scipy.special import gammaln, logsumexp  # noqa: E402
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.feature_extraction.text import CountVectorizer  # noqa: E402
from sklearn.feature_selection import VarianceThreshold  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import dirmult_ext  # noqa: E402
from dirmult_ext import DMClassifier, fit_mixture  # noqa: E402
from dirmult_ext.integrations.sklearn import (  # noqa: E402
    DirichletMultinomialClassifier, DirichletMultinomialMixture)
from reference import separated_mixture  # noqa: E402


def dm_log_pmf(X, alpha):
    """(B, K) float64 log DM(X[b] | alpha[k]), normalized pmf, from gammaln
    (independent of the package's ops)."""
    X = np.asarray(X, dtype=np.float64)
    N, A = X.sum(1), alpha.sum(1)
    coef = gammaln(N + 1) - gammaln(X + 1).sum(1)
    poch = (gammaln(X[:, None, :] + alpha[None]) - gammaln(alpha)[None]).sum(-1)
    return coef[:, None] + gammaln(A)[None] - gammaln(N[:, None] + A[None]) + poch


def mixture_data(B=300, seed=0):
    x, z, alpha = separated_mixture(B=B, seed=seed)
    return x.numpy().astype(np.int64), z.numpy(), alpha.numpy()


# ------------------------------------------------------------ scikit-learn's checks
def _expected_failed_checks(estimator):
    if isinstance(estimator, DirichletMultinomialMixture):
        reason = ("the check reads tags.classifier_tags.multi_class of any estimator "
                  "with predict_proba; a density estimator's classifier_tags are None "
                  "(fit, predict and predict_proba on the sparse X have run by then; "
                  "sparse input is tested in test_sparse_equals_dense)")
        return {"check_estimator_sparse_array": reason,
                "check_estimator_sparse_matrix": reason}
    reason = ("two of the check's three blobs, shifted and rounded to counts, differ "
              "mostly in their totals (mean first-category proportion 0.44 vs 0.34, "
              "totals 6.4 vs 4.0); a DM is a distribution of counts given their total, "
              "so the 3-class accuracy is 0.75 < 0.83 (the 2-class problem passes, "
              "0.945; well-separated counts in test_classifier_pipeline_text)")
    return {"check_classifiers_train": reason,
            "check_classifiers_train(readonly_memmap=True)": reason,
            "check_classifiers_train(readonly_memmap=True,X_dtype=float32)": reason}


@parametrize_with_checks(
    [DirichletMultinomialMixture(n_components=2, n_init=1, n_screen=0, max_iter=20,
                                 random_state=0),
     DirichletMultinomialClassifier(max_iter=50)],
    expected_failed_checks=_expected_failed_checks)
def test_sklearn_estimator_checks(estimator, check):
    name = getattr(check, "func", check).__name__
    if name == "check_array_api_input":
        # scikit-learn runs it only where scipy was imported with SCIPY_ARRAY_API=1
        # (it skips otherwise): a fresh interpreter with it set
        code = "import pickle, sys; check, est = pickle.load(sys.stdin.buffer); check(est)"
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dirmult_ext.__file__)))
        env = dict(os.environ, SCIPY_ARRAY_API="1",
                   PYTHONPATH=pkg_parent + os.pathsep + os.environ.get("PYTHONPATH", ""))
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((check, estimator)),
                             env=env, capture_output=True, timeout=300)
        assert out.returncode == 0, out.stderr.decode()
    else:
        check(estimator)


def test_tags_declare_counts():
    for est in (DirichletMultinomialMixture(), DirichletMultinomialClassifier()):
        tags = est.__sklearn_tags__()
        assert tags.input_tags.positive_only and tags.input_tags.sparse
        assert tags.input_tags.categorical      # the checks then draw integer X


def test_sklearn_is_optional():
    """No module of the package but this one imports scikit-learn; without
    it, importing this one says what to install."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import dirmult_ext\n"
        "names = [m.name for m in pkgutil.walk_packages(dirmult_ext.__path__, 'dirmult_ext.')\n"
        "         if not m.name.endswith('_C_cuda')]  # (a plain library, not a module)\n"
        "assert 'dirmult_ext.integrations.sklearn' in names, names\n"
        "for name in names:\n"
        "    if name != 'dirmult_ext.integrations.sklearn' and not name.endswith('__main__'):\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except ImportError as e:  # another interface whose library is missing\n"
        "            assert name.startswith('dirmult_ext.integrations.'), (name, e)\n"
        "            assert 'pip install' in str(e), (name, e)\n"
        "assert 'sklearn' not in sys.modules, 'a dirmult_ext module imported sklearn'\n"
        "sys.modules['sklearn'] = None\n"
        "try:\n"
        "    import dirmult_ext.integrations.sklearn\n"
        "except ImportError as e:\n"
        "    assert \"pip install 'dirmult_ext[sklearn]'\" in str(e), str(e)\n"
        "else:\n"
        "    raise AssertionError('imported without scikit-learn')\n"
    )
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dirmult_ext.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg_parent + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr


# ------------------------------------------------------------ the mixture
def test_mixture_matches_package_and_reference():
    X, z, _ = mixture_data()
    est = DirichletMultinomialMixture(3, n_init=2, random_state=7).fit(X)
    # the estimator's seed: a RandomState's draw, as scikit-learn seeds from random_state
    seed = int(np.random.RandomState(7).randint(np.iinfo(np.int32).max))
    m = fit_mixture(torch.from_numpy(X), 3, n_init=2, seed=seed, progress=False)
    np.testing.assert_allclose(est.weights_, m.weights.numpy(), rtol=1e-12)
    np.testing.assert_allclose(est.concentrations_, m.alpha.numpy(), rtol=1e-12)
    assert est.converged_ == m.converged and est.n_iter_ == m.n_iter
    assert math.isclose(est.lower_bound_, m.log_lik / X.shape[0], rel_tol=1e-12)
    lb = est.lower_bounds_
    assert lb.shape == (est.n_iter_,) and lb[-1] == est.lower_bound_
    assert np.all(np.diff(lb) >= -1e-12 * abs(lb[-1]))
    np.testing.assert_array_equal(est.predict(X), m.predict(torch.from_numpy(X)).numpy())
    assert est.n_features_in_ == X.shape[1]
    # against the gammaln formula at the fitted parameters
    joint = dm_log_pmf(X, est.concentrations_) + np.log(est.weights_)
    ll = logsumexp(joint, axis=1)
    np.testing.assert_allclose(est.score_samples(X), ll, rtol=1e-10)
    assert math.isclose(est.score(X), ll.mean(), rel_tol=1e-10)
    np.testing.assert_allclose(est.predict_proba(X), np.exp(joint - ll[:, None]),
                               rtol=1e-8, atol=1e-12)
    assert math.isclose(est.lower_bound_, ll.mean(), rel_tol=1e-6)
    # the package's criteria scale (half of -2 log L + ...), p = K V + K - 1
    n, (K, V) = X.shape[0], est.concentrations_.shape
    p = K * V + K - 1
    assert math.isclose(est.bic(X), -ll.sum() + 0.5 * p * math.log(n), rel_tol=1e-10)
    assert math.isclose(est.aic(X), -ll.sum() + p, rel_tol=1e-10)
    assert math.isclose(est.bic(X), est.mixture_.bic, rel_tol=1e-6)
    # the fit finds the components
    from dirmult_ext.models.metrics import adjusted_rand_index
    assert adjusted_rand_index(est.fit_predict(X), z) > 0.95


def test_grid_search_picks_true_k():
    X, _, _ = mixture_data(B=450, seed=1)
    gs = GridSearchCV(DirichletMultinomialMixture(n_init=1, n_screen=5, random_state=0),
                      {"n_components": [1, 2, 3, 4, 5]}, cv=3).fit(X)
    assert gs.best_params_ == {"n_components": 3}, gs.cv_results_["mean_test_score"]
    # the score is the held-out mean log-likelihood
    est = gs.best_estimator_
    assert math.isclose(est.score(X), est.score_samples(X).mean())


def test_mixture_in_pipeline():
    X, z, _ = mixture_data(seed=2)
    X = np.hstack([X, np.full((X.shape[0], 1), 5)])   # a constant column, dropped
    pipe = make_pipeline(VarianceThreshold(),
                         DirichletMultinomialMixture(3, n_init=1, random_state=0))
    labels = pipe.fit_predict(X)
    direct = DirichletMultinomialMixture(3, n_init=1, random_state=0).fit(X[:, :-1])
    np.testing.assert_array_equal(labels, direct.predict(X[:, :-1]))
    np.testing.assert_allclose(pipe.score_samples(X), direct.score_samples(X[:, :-1]),
                               rtol=1e-12)


def test_sparse_equals_dense():
    X, _, _ = mixture_data(seed=4)
    X[:, :6] *= np.random.default_rng(0).random((X.shape[0], 6)) < 0.3   # sparser
    dense = DirichletMultinomialMixture(3, n_init=1, random_state=3).fit(X)
    for S in (sp.csr_matrix(X), sp.csc_array(X), sp.coo_matrix(X)):
        sparse = DirichletMultinomialMixture(3, n_init=1, random_state=3).fit(S)
        np.testing.assert_allclose(sparse.weights_, dense.weights_, rtol=1e-8)
        np.testing.assert_allclose(sparse.concentrations_, dense.concentrations_, rtol=1e-8)
        np.testing.assert_allclose(sparse.score_samples(S), dense.score_samples(X),
                                   rtol=1e-10, atol=1e-12)     # empty rows: log 1
        np.testing.assert_allclose(dense.predict_proba(S), dense.predict_proba(X),
                                   rtol=1e-10, atol=1e-14)


def test_torch_input():
    X, _, _ = mixture_data(seed=5)
    ref = DirichletMultinomialMixture(3, n_init=1, random_state=1).fit(X)
    for T in (torch.from_numpy(X), torch.from_numpy(X).float(),
              torch.from_numpy(X).to(torch.bfloat16),           # exact: counts below 256
              torch.from_numpy(X).to_sparse_csr(), torch.from_numpy(X).to_sparse_coo()):
        est = DirichletMultinomialMixture(3, n_init=1, random_state=1).fit(T)
        np.testing.assert_allclose(est.concentrations_, ref.concentrations_, rtol=1e-8)
        np.testing.assert_allclose(est.score_samples(T), ref.score_samples(X), rtol=1e-10)
        np.testing.assert_array_equal(est.predict(T), ref.predict(X))


def test_warm_start_continues_em():
    X, _, _ = mixture_data(seed=6)
    cold = DirichletMultinomialMixture(3, n_init=1, n_screen=0, tol=1e-10, max_iter=500,
                                       init_params="random", random_state=0).fit(X)
    est = DirichletMultinomialMixture(3, n_init=1, n_screen=0, tol=1e-10, max_iter=2,
                                      init_params="random", random_state=0, warm_start=True)
    with pytest.warns(ConvergenceWarning):        # not converged in 2 iterations
        est.fit(X)
    bounds = [est.lower_bound_]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(200):
            est.fit(X)
            bounds.append(est.lower_bound_)
            if est.converged_:
                break
    assert est.converged_
    assert np.all(np.diff(bounds) >= -1e-9 * abs(bounds[-1])), bounds   # EM is monotone
    assert math.isclose(est.lower_bound_, cold.lower_bound_, rel_tol=1e-6)
    # a warm start from the converged fit stays there
    done = clone(cold).set_params(warm_start=True).fit(X)
    done.fit(X)
    assert done.n_iter_ <= 3 and math.isclose(done.lower_bound_, cold.lower_bound_,
                                              rel_tol=1e-9)
    with pytest.raises(ValueError, match="n_components"):
        done.set_params(n_components=2).fit(X)


def test_verbose(capsys):
    X, _, _ = mixture_data(B=60, seed=7)
    DirichletMultinomialMixture(2, n_init=1, random_state=0).fit(X)
    assert capsys.readouterr().out == ""
    est = DirichletMultinomialMixture(2, n_init=1, random_state=0, verbose=1).fit(X)
    out = capsys.readouterr().out
    assert f"{est.n_iter_} EM iterations" in out and "log-likelihood per sample" in out


def test_sample():
    X, _, alpha = mixture_data(B=600, seed=8)
    est = DirichletMultinomialMixture(3, n_init=1, random_state=0).fit(X)
    Xs, ys = est.sample(3000, n_trials=200)
    assert Xs.shape == (3000, X.shape[1]) and Xs.dtype == np.int64
    assert np.all(Xs.sum(1) == 200)
    np.testing.assert_array_equal(ys, np.sort(ys))            # grouped by component
    freq = np.bincount(ys, minlength=3) / 3000
    np.testing.assert_allclose(freq, est.weights_, atol=0.04)
    for k in range(3):                  # mean proportions: alpha_k / sum(alpha_k)
        a = est.concentrations_[k]
        np.testing.assert_allclose((Xs[ys == k] / 200).mean(0), a / a.sum(), atol=0.03)
    Xd, _ = est.sample(50)
    assert set(Xd.sum(1)) <= set(X.sum(1))                 # totals of the training rows
    with pytest.raises(ValueError, match="n_samples"):
        est.sample(0)
    with pytest.raises(ValueError, match="n_trials"):
        est.sample(2, n_trials=-1)


@pytest.mark.parametrize("Est", [DirichletMultinomialMixture, DirichletMultinomialClassifier])
def test_bad_counts(Est):
    X, z, _ = mixture_data(B=40, seed=9)
    y = z.astype(str)
    est = Est()

    def fit(X):
        return est.fit(X) if Est is DirichletMultinomialMixture else est.fit(X, y)

    with pytest.raises(ValueError, match="Negative values in data passed to .* as X"):
        fit(X - 1)
    half = X.astype(np.float64)
    half[3, 2] += 0.5
    with pytest.raises(ValueError, match="Non-integer values .* as X.*integer counts"):
        fit(half)
    with pytest.raises(ValueError, match="Non-integer"):
        fit(sp.csr_matrix(half))
    with pytest.raises(ValueError, match="1 feature"):
        fit(X[:, :1])
    fit(X.astype(np.float32))                      # integer-valued floats are counts
    with pytest.raises(ValueError, match="Negative"):
        est.predict(-X)


# ------------------------------------------------------------ the classifier
def test_classifier_pipeline_text():
    """CountVectorizer's sparse counts and string labels, through a Pipeline."""
    rng = np.random.default_rng(10)
    vocab = np.array([f"w{i}" for i in range(30)])
    alpha = {"ham": np.r_[np.full(15, 2.0), np.full(15, 0.2)],
             "spam": np.r_[np.full(15, 0.2), np.full(15, 2.0)]}
    labels = rng.choice(["ham", "spam"], 400)
    docs = [" ".join(rng.choice(vocab, 30, p=rng.dirichlet(alpha[c]))) for c in labels]
    train, test = slice(0, 300), slice(300, 400)
    pipe = make_pipeline(CountVectorizer(), DirichletMultinomialClassifier())
    pipe.fit(docs[train], labels[train])
    pred = pipe.predict(docs[test])
    assert pred.dtype.kind == "U" and set(pred) <= {"ham", "spam"}
    assert np.mean(pred == labels[test]) > 0.95
    clf = pipe[-1]
    np.testing.assert_array_equal(clf.classes_, ["ham", "spam"])
    # the package's classifier on the same counts, labels as class indices
    Xte = pipe[0].transform(docs[test])
    pkg = DMClassifier().fit(pipe[0].transform(docs[train]),
                             (labels[train] == "spam").astype(int))
    np.testing.assert_array_equal(pred, clf.classes_[pkg.predict(Xte)])
    np.testing.assert_allclose(clf.predict_log_proba(Xte), pkg.predict_log_proba(Xte).numpy(),
                               rtol=1e-12)
    # against the gammaln formula at the fitted parameters
    joint = dm_log_pmf(Xte.toarray(), clf.concentrations_) + clf.class_log_prior_
    ref = joint - logsumexp(joint, axis=1, keepdims=True)
    np.testing.assert_allclose(clf.predict_log_proba(Xte), ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(clf.predict_proba(Xte), np.exp(ref), rtol=1e-8, atol=1e-12)
    assert math.isclose(pipe.score(docs[test], labels[test]), np.mean(pred == labels[test]))


def test_classifier_sparse_torch_dense_agree():
    X, z, _ = mixture_data(seed=11)
    y = np.array(["a", "b", "c"], dtype=object)[z]
    ref = DirichletMultinomialClassifier().fit(X, y)
    for Xi in (sp.csr_matrix(X), torch.from_numpy(X), torch.from_numpy(X).to_sparse_csr()):
        est = DirichletMultinomialClassifier().fit(Xi, y)
        np.testing.assert_allclose(est.concentrations_, ref.concentrations_, rtol=1e-8)
        np.testing.assert_allclose(est.predict_proba(Xi), ref.predict_proba(X), rtol=1e-8,
                                   atol=1e-12)
        np.testing.assert_array_equal(est.predict(Xi), ref.predict(X))
    assert ref.score(X, y) > 0.95 and ref.n_features_in_ == X.shape[1]
