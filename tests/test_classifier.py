"""The class-conditional DM classifier: per-class MLEs, the class prior,
posterior probabilities against the float64 formula."""
import math

import numpy as np
import pytest
import torch

import dirmult_ext
from dirmult_ext.likelihood.distribution import DirichletMultinomial
from dirmult_ext import fit
from dirmult_ext.models.classifier import DMClassifier

from reference import log_lik_float64, separated_mixture

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS else [])



@pytest.mark.parametrize("device", DEVICES)
def test_classifier(device):
    x, z, alpha = separated_mixture(B=600)
    names = np.array(["a", "b", "c"])[z.numpy()]
    tr, te = slice(0, 450), slice(450, None)
    clf = DMClassifier(device=device).fit(x[tr], names[tr])
    assert list(clf.classes_) == ["a", "b", "c"]
    assert bool(clf.converged_.all())
    assert clf.score(x[te], names[te]) > 0.95
    lp = clf.predict_log_proba(x[te])
    torch.testing.assert_close(lp.exp().sum(-1).cpu(), torch.ones(150, dtype=torch.float64))
    # each class's alpha is the DM MLE on that class's rows
    for c, name in enumerate(clf.classes_):
        r = fit(x[tr][torch.as_tensor(names[tr] == name)], min_alpha=clf.min_alpha)
        torch.testing.assert_close(clf.log_alpha_[c], r.log_alpha, rtol=0, atol=1e-4)
    u = DMClassifier(prior="uniform").fit(x[tr], names[tr])
    torch.testing.assert_close(u.log_prior_, torch.full((3,), -math.log(3), dtype=torch.float64))
    with pytest.raises(RuntimeError, match="not fitted"):
        DMClassifier().predict(x)
    with pytest.raises(ValueError, match="labels"):
        DMClassifier().fit(x, names[:10])


@pytest.mark.parametrize("device", DEVICES)
def test_class_prior_enters_the_posterior(device):
    """Imbalanced (9:1), overlapping classes: the posterior is
    log_softmax_c(log DM(n | alpha_c) + log prior_c), the float64 formula at
    the fitted concentrations plus the log class frequencies (seen: 1.3e-14
    apart; tolerance 1e-12), and the prior matters: the empirical prior
    classifies more rows right than the uniform one on data drawn with the
    same imbalance (seen: 0.90 against 0.66-0.68)."""
    V = 6
    alpha = torch.tensor([[1.0] * V, [1.6, 1.6, 1.6, 0.7, 0.7, 0.7]], dtype=torch.float64)
    z = (torch.rand(3000) < 0.1).long()
    x = DirichletMultinomial(torch.randint(5, 15, (3000,)), alpha[z]).sample().float()
    tr, te = slice(0, 2000), slice(2000, None)
    clf = DMClassifier(device=device).fit(x[tr], z[tr].numpy())
    freq = torch.bincount(z[tr], minlength=2).double() / 2000
    torch.testing.assert_close(clf.log_prior_, freq.log(), rtol=1e-12, atol=0)
    ll = torch.stack([log_lik_float64(x[te], la) for la in clf.log_alpha_], -1)
    expected = torch.log_softmax(ll + freq.log(), -1)
    assert (clf.predict_log_proba(x[te]).cpu() - expected).abs().max() < 1e-12
    uniform = DMClassifier(prior="uniform", device=device).fit(x[tr], z[tr].numpy())
    acc, acc_uniform = clf.score(x[te], z[te].numpy()), uniform.score(x[te], z[te].numpy())
    assert acc > acc_uniform + 0.1, (acc, acc_uniform)
