"""dirmult::log_lik through log_lik(): values against the float64 lgamma
formula and mpmath (every count dtype, shared and per-sample concentrations,
normalize on and off, odd shapes and layouts, bad counts), gradients
(gradcheck, float32 against the float64 formula's autograd, training), and
the eager fast path against the registered op."""
import math

import mpmath
import pytest
import torch

import dirmult_ext

from reference import (COUNT_DTYPES, grad_float64, grad_tolerances, log_lik_float64, magnitudes,
                       mp_lnpoch, random_counts, tolerance)


@pytest.mark.parametrize("dtype", COUNT_DTYPES)
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
def test_forward_matches_float64(device, dtype, shared, normalize):
    B, V = int(torch.randint(1, 40, ())), int(torch.randint(1, 300, ()))
    counts = random_counts((B, V), dtype, device)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    la_shape = (V,) if shared else (B, V)
    log_alpha = torch.empty(la_shape, dtype=compute).uniform_(-3, 4).to(device)
    out = dirmult_ext.log_lik(counts, log_alpha, normalize=normalize)
    assert out.shape == (B,) and out.dtype == compute and out.device == counts.device
    ref = log_lik_float64(counts, log_alpha, normalize)
    scale = magnitudes(counts, log_alpha, normalize)[0].clamp_min(1.0)
    assert ((out.double().cpu() - ref).abs() / scale).max() < tolerance(dtype)


@pytest.mark.parametrize("shape", [(0, 5), (3, 1), (1, 1), (2, 3, 7), (4, 0, 6), (7,), (5, 4, 2, 3)])
def test_shapes(device, shape):
    counts = random_counts(shape, torch.float32, device) if 0 not in shape else \
        torch.zeros(shape, device=device)
    log_alpha = torch.randn(shape[-1], device=device)
    out = dirmult_ext.log_lik(counts, log_alpha)
    assert out.shape == shape[:-1]
    if out.numel():
        ref = log_lik_float64(counts.reshape(-1, shape[-1]), log_alpha).reshape(shape[:-1])
        torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-6, atol=2e-5)


@pytest.mark.parametrize("shared", [True, False])
def test_no_categories(device, shared):
    """V = 0: every row is empty, its log-likelihood 0 (written, not left as
    uninitialized memory), the gradient empty."""
    for _ in range(3):  # fresh allocations, so that garbage would show
        torch.randn(4096, device=device)
        counts = torch.zeros(5, 0, device=device, requires_grad=True)
        la = torch.zeros((0,) if shared else (5, 0), device=device, requires_grad=True)
        out = dirmult_ext.log_lik(counts, la, normalize=True)
        assert torch.equal(out, torch.zeros(5, device=device))
        g_la, g_counts = torch.autograd.grad(out.sum(), [la, counts])
        assert g_la.shape == la.shape and g_counts.shape == counts.shape
    comps = dirmult_ext.log_lik_components(torch.zeros(5, 0, device=device),
                                           torch.zeros(3, 0, device=device))
    assert torch.equal(comps, torch.zeros(5, 3, device=device))


def test_per_sample_3d(device):
    counts = random_counts((3, 4, 50), torch.float32, device)
    log_alpha = torch.randn(3, 4, 50, device=device)
    out = dirmult_ext.log_lik(counts, log_alpha, normalize=True)
    ref = log_lik_float64(counts.reshape(12, 50), log_alpha.reshape(12, 50), True).reshape(3, 4)
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-6, atol=2e-5)


def test_wide_rows_are_split_and_exact(device):
    """Few long rows exercise the split-row path (partials summed in order)."""
    counts = random_counts((3, 70001), torch.float32, device, zero_frac=0.9)
    log_alpha = torch.empty(70001).uniform_(-2, 3).to(device)
    out = dirmult_ext.log_lik(counts, log_alpha)
    ref = log_lik_float64(counts, log_alpha)
    assert ((out.double().cpu() - ref).abs() / ref.abs()).max() < 2e-6


@pytest.mark.parametrize("shared", [True, False])
def test_few_long_rows_forward_and_gradient_match_float64(device, shared):
    """Few rows of many columns: split into column chunks on CPU (rows alone
    would leave threads idle); a row with a bad count stays NaN."""
    B, V = 5, 40000
    counts = random_counts((B, V), torch.float32, "cpu", zero_frac=0.5)
    counts[1, 123] = 2.5  # off the exact path
    log_alpha = torch.empty((V,) if shared else (B, V)).uniform_(-2, 3)
    la = log_alpha.to(device).requires_grad_()
    out = dirmult_ext.log_lik(counts.to(device), la, normalize=True)
    ref = log_lik_float64(counts, log_alpha, True)
    assert ((out.detach().double().cpu() - ref).abs() / ref.abs()).max() < 2e-6
    w = torch.randn(B, dtype=torch.float64)
    g, = torch.autograd.grad((out.double() * w.to(device)).sum(), la)
    la64 = log_alpha.double().requires_grad_()
    g64, = torch.autograd.grad(
        (dirmult_ext.reference_log_lik(counts.double(), la64, True) * w).sum(), la64)
    assert ((g.double().cpu() - g64).abs().max() / g64.abs().max()) < 1e-5
    bad = counts.clone()
    bad[3, 30000] = -1.0
    out = dirmult_ext.log_lik(bad.to(device), la.detach(), normalize=True).cpu()
    assert torch.isnan(out).tolist() == [False, False, False, True, False]


def test_alpha_keyword_and_float64_promotion(device):
    counts = random_counts((5, 9), torch.int64, device)
    alpha = torch.rand(9, dtype=torch.float64, device=device) + 0.1
    out = dirmult_ext.log_lik(counts, alpha=alpha)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out.cpu(), log_lik_float64(counts, alpha.log()), rtol=1e-12, atol=1e-10)


def test_large_counts_keep_exact_totals(device):
    """int64 counts above 2^24: N is accumulated exactly."""
    counts = torch.tensor([[2**25 + 1, 3, 0, 2**24 + 7]], dtype=torch.int64, device=device)
    log_alpha = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64, device=device)
    out = dirmult_ext.log_lik(counts, log_alpha)
    torch.testing.assert_close(out.cpu(), log_lik_float64(counts, log_alpha), rtol=1e-13, atol=0)


def test_noninteger_counts(device):
    counts = torch.rand(6, 20, dtype=torch.float64, device=device) * 40
    log_alpha = torch.randn(20, dtype=torch.float64, device=device)
    out = dirmult_ext.log_lik(counts, log_alpha, normalize=True)
    torch.testing.assert_close(out.cpu(), log_lik_float64(counts, log_alpha, True), rtol=1e-11, atol=1e-9)


def test_module_matches_function(device):
    V = 33
    model = dirmult_ext.DirichletMultinomialLogLik(V, torch.randn(V)).to(device)
    counts = random_counts((8, V), torch.float32, device)
    torch.testing.assert_close(model(counts), dirmult_ext.log_lik(counts, model.log_alpha))


def test_results_are_deterministic(device):
    counts = random_counts((300, 2000), torch.float32, device)
    log_alpha = torch.randn(2000, device=device, requires_grad=True)
    out1 = dirmult_ext.log_lik(counts, log_alpha)
    g1, = torch.autograd.grad(out1.sum(), log_alpha)
    out2 = dirmult_ext.log_lik(counts, log_alpha)
    g2, = torch.autograd.grad(out2.sum(), log_alpha)
    assert torch.equal(out1, out2) and torch.equal(g1, g2)


# Bad counts far outside int's range (a table lookup must test them before
# any conversion to int, which would be undefined; -2^31 would index before
# the table). Every path gives NaN for the bad rows only, the others stay
# exact.
@pytest.mark.parametrize("B", [8, 70])  # CUDA: math path / lookup tables; CPU: tables
def test_extreme_negative_counts_give_nan_rows(device, B):
    bad = [-1.0, -2.0 ** 31, -3e9, -float("inf"), float("nan"), -0.5]
    for dtype in (torch.float32, torch.float64):
        counts = random_counts((B, 6), dtype, "cpu")
        rows = list(range(0, B, max(1, B // len(bad))))[:len(bad)]
        for r, x in zip(rows, bad):
            counts[r, r % 6] = x
        good = torch.ones(B, dtype=torch.bool)
        good[rows] = False
        ref = log_lik_float64(counts[good], torch.zeros(6))
        c = counts.to(device)
        for la in (torch.zeros(6, dtype=dtype, device=device),
                   torch.zeros(B, 6, dtype=dtype, device=device)):
            out = dirmult_ext.log_lik(c, la).cpu()
            assert torch.isnan(out[rows]).all() and not torch.isnan(out[good]).any()
            assert ((out[good].double() - ref).abs() / ref.abs().clamp_min(1.0)).max() < tolerance(dtype)
            g, gc = torch.ops.dirmult.log_lik_backward(torch.ones(B, dtype=dtype, device=device),
                                                       c, la, False, True)
            assert torch.isnan(g).any() and gc.shape == c.shape
        comps = dirmult_ext.log_lik_components(c, torch.zeros(3, 6, dtype=dtype, device=device))
        assert torch.isnan(comps[rows]).all() and not torch.isnan(comps[good]).any()
        w = good.to(dtype=dtype, device=device)  # bad rows weigh 0: a finite gradient
        la = torch.zeros(6, dtype=dtype, device=device, requires_grad=True)
        g, = torch.autograd.grad((dirmult_ext.log_lik(c, la) * w).sum(), la)
        assert torch.isfinite(g).all()


# The same bad counts with fewer rows than the CPU's tables need (4): the
# math path, shared and per-sample alpha.
@pytest.mark.parametrize("x", [-1.0, -2.0 ** 31, -3e9, -float("inf"), float("nan"), -0.5])
def test_extreme_negative_count_in_few_rows(device, x):
    counts = random_counts((3, 6), torch.float32, "cpu")
    counts[1, 2] = x
    ref = log_lik_float64(counts[[0, 2]], torch.zeros(6))
    for la in (torch.zeros(6, device=device), torch.zeros(3, 6, device=device)):
        out = dirmult_ext.log_lik(counts.to(device), la).cpu()
        assert torch.isnan(out[1]) and not torch.isnan(out[[0, 2]]).any()
        assert ((out[[0, 2]].double() - ref).abs() / ref.abs().clamp_min(1.0)).max() < 2e-6


def test_float64_reference_matches_mpmath():
    """The tests' float64 reference (reference_log_lik, plain torch.lgamma)
    is itself right: within 1e-13 of mpmath relative to the row's terms
    (counts up to 1000, alpha in [0.01, 150]; seen: 1e-15)."""
    B, V = 4, 7
    counts = random_counts((B, V), torch.float64, "cpu", high=1000, zero_frac=0.3)
    la = torch.empty(B, V, dtype=torch.float64).uniform_(math.log(0.01), math.log(150.0))
    out = log_lik_float64(counts, la, normalize=True)
    for b in range(B):
        a = [mpmath.exp(mpmath.mpf(float(x))) for x in la[b]]
        n = [mpmath.mpf(float(x)) for x in counts[b]]
        terms = [mp_lnpoch(a[v], n[v]) - mpmath.loggamma(n[v] + 1) for v in range(V)]
        terms += [-mp_lnpoch(sum(a), sum(n)), mpmath.loggamma(sum(n) + 1)]
        scale = sum(abs(t) for t in terms)
        assert abs(float(out[b]) - float(sum(terms))) / float(scale) < 1e-13


@pytest.mark.parametrize("shared", [True, False])
def test_row_totals_match_mpmath(device, shared):
    """Row totals within 1e-6 of the sum of their terms' magnitudes, over
    alpha in [1e-6, 1e7] and counts up to 1e7, float32 throughout."""
    g = torch.Generator().manual_seed(torch.seed())
    B, V = 6, 12
    shape = (V,) if shared else (B, V)
    log_alpha = torch.empty(shape, dtype=torch.float64).uniform_(
        math.log(1e-6), math.log(1e7), generator=g).float()
    counts = torch.where(
        torch.rand(B, V, generator=g) < 0.5,
        torch.randint(0, 10, (B, V), generator=g).double(),
        torch.exp(torch.empty(B, V, dtype=torch.float64).uniform_(0, math.log(1e7), generator=g)).round(),
    ).float()
    out = dirmult_ext.log_lik(counts.to(device), log_alpha.to(device)).cpu()
    eager = dirmult_ext.reference_log_lik(counts, log_alpha)
    # The true value at the float32 log_alpha inputs.
    alpha = log_alpha.double().exp()
    worst, worst_eager = 0.0, 0.0
    for b in range(B):
        a_row = alpha if shared else alpha[b]
        terms = [mp_lnpoch(a_row[v], counts[b, v]) for v in range(V)]
        A = sum(float(a) for a in a_row)  # float64 sum, as the kernel
        terms.append(-mp_lnpoch(A, float(counts[b].double().sum())))
        total = sum(terms)
        scale = sum(abs(t) for t in terms)
        err = abs(float(out[b]) - float(total)) / float(scale)
        worst = max(worst, err)
        worst_eager = max(worst_eager, abs(float(eager[b]) - float(total)) / float(scale))
        assert err <= 1e-6, (b, float(out[b]), float(total))
    print(f"\n[{device}] worst row error / sum|terms|: dirmult {worst:.2e}, eager float32 {worst_eager:.2e}")


# ------------------------------------------------------------------ gradients


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


def test_alpha_keyword_gradient(device):
    counts, _ = _inputs(device)
    alpha = torch.rand(6, dtype=torch.float64, device=device).add(0.2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: dirmult_ext.log_lik(counts, alpha=a), (alpha,))


@pytest.mark.parametrize("shared", [True, False])
def test_gradient_matches_float64_formula(device, shared):
    """Weighted rows, float32 and float64, against autograd of the float64
    lgamma formula, relative to the largest |gradient| (CPU, seen over 6
    draws of each layout: float32 2.9e-7, float64 5.4e-14)."""
    B, V = 257, 1500  # several row tiles and column chunks
    counts = random_counts((B, V), torch.float32, device, zero_frac=0.7)
    la64 = torch.empty((V,) if shared else (B, V), dtype=torch.float64).uniform_(-3, 5).to(device)
    w = torch.randn(B, dtype=torch.float64, device=device)
    ref = grad_float64(counts, la64, w)
    scale = ref.abs().max()
    for dtype, tol in zip((torch.float32, torch.float64), grad_tolerances(device)):
        la = la64.to(dtype).requires_grad_()
        out = dirmult_ext.log_lik(counts.to(dtype), la)
        g, = torch.autograd.grad((out * w.to(dtype)).sum(), la)
        assert ((g.double().cpu() - ref).abs() / scale).max() < tol, dtype


def test_training_follows_the_float64_formula(device):
    """The drop-in module trains: 30 plain SGD steps on the mean NLL lower
    it, and land where the same steps on the float64 formula do (SGD, not
    Adam: Adam's steps do not depend on the gradient's scale). CPU, seen:
    the parameters within 1.4e-7 of the reference's; tolerance 1e-6 (CUDA:
    1e-5, the bound of its float32 gradients, grad_tolerances)."""
    V = 20
    true_la = torch.randn(V)
    probs = torch.distributions.Dirichlet(true_la.exp()).sample((512,))
    counts = torch.distributions.Multinomial(30, probs=probs).sample()
    model = dirmult_ext.DirichletMultinomialLogLik(V).to(device)
    ref = torch.zeros(V, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD([ref], lr=0.1)
    losses = []
    for _ in range(30):
        loss = -model(counts.to(device)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        loss_ref = -log_lik_float64(counts, ref).mean()
        opt_ref.zero_grad()
        loss_ref.backward()
        opt_ref.step()
    assert losses[-1] < losses[0] - 1.0
    tol = 1e-6 if device.type == "cpu" else 1e-5
    assert (model.log_alpha.detach().double().cpu() - ref.detach()).abs().max() < tol


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
