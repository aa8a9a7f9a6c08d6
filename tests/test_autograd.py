"""Gradients: gradcheck in float64, and float32 against float64."""
import pytest
import torch

import dirmult_ext

from test_component_tables import weighted_component_grads
from reference import magnitudes
from test_values import random_counts


def _inputs(device, B=4, V=6, shared=True, frac=False):
    counts = random_counts((B, V), torch.float64, device, zero_frac=0.3)
    if frac:
        counts = counts + torch.rand(B, V, dtype=torch.float64, device=device)
    la = torch.empty((V,) if shared else (B, V), dtype=torch.float64).uniform_(-2, 3).to(device)
    return counts, la.requires_grad_()


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck_log_alpha(device, shared, normalize):
    counts, la = _inputs(device, shared=shared)
    assert torch.autograd.gradcheck(
        lambda la: dirmult_ext.log_lik(counts, la, normalize=normalize), (la,))


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck_counts(device, shared, normalize):
    counts, la = _inputs(device, shared=shared, frac=True)
    counts.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda c, la: dirmult_ext.log_lik(c, la, normalize=normalize), (counts, la))


def test_gradcheck_large_concentrations(device):
    counts, _ = _inputs(device, B=3, V=5)
    la = torch.empty(5, dtype=torch.float64).uniform_(8, 14).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda la: dirmult_ext.log_lik(counts, la), (la,), rtol=1e-4)


def test_gradcheck_components(device):
    counts, _ = _inputs(device, B=5, V=7)
    la = torch.empty(3, 7, dtype=torch.float64).uniform_(-2, 3).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda la: dirmult_ext.log_lik_components(counts, la), (la,))


def test_alpha_keyword_gradient(device):
    counts, _ = _inputs(device)
    alpha = torch.rand(6, dtype=torch.float64, device=device).add(0.2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: dirmult_ext.log_lik(counts, alpha=a), (alpha,))


@pytest.mark.parametrize("shared", [True, False])
def test_float32_gradient_matches_float64(device, shared):
    B, V = 257, 1500  # several row tiles and column chunks
    counts = random_counts((B, V), torch.float32, device, zero_frac=0.7)
    la64 = torch.empty((V,) if shared else (B, V), dtype=torch.float64).uniform_(-3, 5).to(device)
    w = torch.randn(B, dtype=torch.float64, device=device)
    grads = []
    for dtype in (torch.float32, torch.float64):
        la = la64.to(dtype).requires_grad_()
        out = dirmult_ext.log_lik(counts.to(dtype), la)
        grads.append(torch.autograd.grad((out * w.to(dtype)).sum(), la)[0].double())
    scale = grads[1].abs().max()
    assert ((grads[0] - grads[1]).abs() / scale).max() < 1e-5


def test_components_gradient_matches_float64(device):
    B, V, K = 300, 1100, 6
    counts = random_counts((B, V), torch.float32, device, zero_frac=0.6)
    la64 = torch.empty(K, V, dtype=torch.float64).uniform_(-3, 5).to(device)
    w = torch.randn(B, K, dtype=torch.float64, device=device)
    grads = weighted_component_grads(counts, la64, w)
    # and against K separate log_lik calls in float64
    la = la64.clone().requires_grad_()
    sep = torch.stack([dirmult_ext.log_lik(counts.double(), la[k]) for k in range(K)], -1)
    g_sep, = torch.autograd.grad((sep * w).sum(), la)
    torch.testing.assert_close(grads[1], g_sep, rtol=1e-10, atol=1e-8)
    assert ((grads[0] - grads[1]).abs() / grads[1].abs().max()).max() < 1e-5


def test_training_step_reduces_loss(device):
    """The drop-in module trains: a few Adam steps lower the NLL."""
    V = 20
    true_la = torch.randn(V)
    probs = torch.distributions.Dirichlet(true_la.exp()).sample((512,))
    counts = torch.distributions.Multinomial(30, probs=probs).sample().to(device)
    model = dirmult_ext.DirichletMultinomialLogLik(V).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    losses = []
    for _ in range(30):
        loss = -model(counts).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0


def _grads(fn, counts, la, upstream):
    counts = counts.detach().clone().requires_grad_(counts.requires_grad)
    la = la.detach().clone().requires_grad_()
    out = fn(counts, la)
    wrt = [t for t in (counts, la) if t.requires_grad]
    return (out.detach(), *torch.autograd.grad(out, wrt, upstream))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("counts_grad", [False, True])
def test_eager_fast_path_matches_registered_op(device, dtype, counts_grad):
    # The Python API's eager path (its own autograd.Function) and the op's
    # registered autograd formula must be the same numbers, bit for bit --
    # except where the eager path takes the single pass (log_lik_with_grad:
    # CUDA float32 from one row, only log_alpha needing a gradient), whose
    # forward sums each row in another order than the forward kernel (here
    # the table forward kernel): there, float32 rounding apart.
    counts, la = _inputs(device, B=40, V=300, frac=counts_grad)
    counts, la = counts.to(dtype).requires_grad_(counts_grad), la.detach().to(dtype)
    upstream = torch.randn(40, dtype=dtype, device=device)
    fast = _grads(lambda c, a: dirmult_ext.log_lik(c, a, normalize=True), counts, la, upstream)
    op = _grads(lambda c, a: torch.ops.dirmult.log_lik(c, a, True), counts, la, upstream)
    assert len(fast) == len(op) == (3 if counts_grad else 2)
    if torch.device(device).type == "cuda" and dtype == torch.float32 and not counts_grad:
        rows, _ = magnitudes(counts, la, normalize=True)
        assert ((fast[0].double() - op[0].double()).abs().cpu() / rows).max() < 1e-6
        fast, op = fast[1:], op[1:]  # (the upstream gradient is not uniform: same backward)
    for f, o in zip(fast, op):
        assert torch.equal(f, o)
    cfast = _grads(lambda c, a: dirmult_ext.log_lik_components(c, a),
                   counts.detach(), la.expand(3, -1), upstream[:, None].expand(-1, 3))
    cop = _grads(lambda c, a: torch.ops.dirmult.log_lik_components(c, a, False),
                 counts.detach(), la.expand(3, -1), upstream[:, None].expand(-1, 3))
    for f, o in zip(cfast, cop):
        assert torch.equal(f, o)


def test_no_grad_and_inference_mode_paths(device):
    counts, la = _inputs(device, B=5, V=7)
    expected = dirmult_ext.log_lik(counts, la)
    assert expected.requires_grad
    with torch.no_grad():
        out = dirmult_ext.log_lik(counts, la)
    assert not out.requires_grad and torch.equal(out, expected.detach())
    with torch.inference_mode():
        assert torch.equal(dirmult_ext.log_lik(counts, la), out)
