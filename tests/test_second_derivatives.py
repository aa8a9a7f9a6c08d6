"""Second derivatives of log_lik and log_lik_components with respect to the
concentrations: the elementwise terms (dirmult::tpoch_terms) against mpmath,
gradgradcheck of the ops and the Python API, Hessians against mpmath, the
float64 lgamma formula and finite differences, and the errors for what is
not supported (counts, third derivatives)."""
import math

import mpmath
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dirmult_ext
from dirmult_ext.ops import dispatch

from reference import _mpf, log_lik_float64, mp_adpoch

ops = torch.ops.dirmult


# ------------------------------------------------------------ tpoch_terms
def _mp_tpoch_terms(log_a, n):
    """(a^2 (psi1(a+n) - psi1(a)), that + a (psi(a+n) - psi(a)), and the sum
    of the two terms' sizes) at the given float inputs."""
    a, n = mpmath.exp(_mpf(log_a)), _mpf(n)
    if n == 0:
        return 0.0, 0.0, 1.0
    a2t = a * a * (mpmath.polygamma(1, a + n) - mpmath.polygamma(1, a))
    adp = mp_adpoch(a, n)
    return float(a2t), float(a2t + adp), float(abs(a2t) + abs(adp))


def _draw_tpoch_inputs(count, generator):
    """log_alpha uniform on [log 1e-6, log 1e8]; n: small integers (the exact
    sums), integers up to 1e8, non-integers from 1e-4 to 1e7, and
    non-integers near small integers (1 is dadpoch's zero)."""
    la = torch.empty(count, dtype=torch.float64).uniform_(math.log(1e-6), math.log(1e8),
                                                           generator=generator)
    kind = torch.randint(0, 4, (count,), generator=generator)
    small = torch.randint(0, 20, (count,), generator=generator).double()
    large = torch.exp(torch.empty(count, dtype=torch.float64).uniform_(
        math.log(17), math.log(1e8), generator=generator)).round()
    frac = torch.exp(torch.empty(count, dtype=torch.float64).uniform_(
        math.log(1e-4), math.log(1e7), generator=generator))
    near = (torch.randint(1, 4, (count,), generator=generator).double()
            + torch.empty(count, dtype=torch.float64).uniform_(-1e-3, 1e-3, generator=generator))
    n = torch.where(kind == 0, small, torch.where(kind == 1, large,
                                                  torch.where(kind == 2, frac, near)))
    # The path boundaries and the range's ends.
    edge_a = [1e-6, 1e-6, 1e8, 1e8, 15.999, 16.0, 16.001, 1.0, 1.0, 1e-6, 1e8]
    edge_n = [1e8, 0.5, 1e8, 0.5, 16.0, 17.0, 2.5, 16.0, 17.0, 1.0 + 2 ** -20, 1.0 - 2 ** -20]
    la = torch.cat([la, torch.tensor(edge_a, dtype=torch.float64).log()])
    n = torch.cat([n, torch.tensor(edge_n, dtype=torch.float64)])
    return la, n


# Observed (float64): a2tpoch within 2 ulps relative, dadpoch within 2.2 ulps
# of its terms' size |a2tpoch| + |adpoch| (near n = 1, its zero, it is the
# difference of two such terms); float32 (float64 rounded once): 0.5 ulp
# relative for both.
TPOCH_ULPS = {torch.float64: (4.0, 4.0), torch.float32: (1.0, 1.0)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tpoch_terms_against_mpmath(device, dtype):
    generator = torch.Generator().manual_seed(torch.randint(0, 2 ** 31, ()).item())
    la, n = _draw_tpoch_inputs(400, generator)
    la, n = la.to(dtype), n.to(dtype)
    a2t, dad = (t.cpu() for t in ops.tpoch_terms(la.to(device), n.to(device)))
    eps = torch.finfo(dtype).eps
    tol_a2t, tol_dad = TPOCH_ULPS[dtype]
    worst_a2t = worst_dad = 0.0
    for i in range(la.numel()):
        ref_a2t, ref_dad, size = _mp_tpoch_terms(la[i].item(), n[i].item())
        err_a2t = abs(a2t[i].item() - ref_a2t) / max(abs(ref_a2t), 1e-300) / eps
        dad_scale = abs(ref_dad) if dtype == torch.float32 else size
        err_dad = abs(dad[i].item() - ref_dad) / max(dad_scale, 1e-300) / eps
        # (n = 1: dadpoch is 0 exactly, and the float32 relative measure
        # takes mpmath's rounding of 0 for a value.)
        if n[i].item() == 1.0:
            assert dad[i].item() == 0.0
            err_dad = 0.0
        worst_a2t, worst_dad = max(worst_a2t, err_a2t), max(worst_dad, err_dad)
        assert err_a2t <= tol_a2t and err_dad <= tol_dad, (
            f"a={math.exp(la[i].item())!r} n={n[i].item()!r}: a2tpoch {a2t[i].item()!r} vs "
            f"{ref_a2t!r} ({err_a2t:.2f} ulp), dadpoch {dad[i].item()!r} vs {ref_dad!r} "
            f"({err_dad:.2f} ulp)")
    print(f"tpoch_terms {dtype} on {device}: worst {worst_a2t:.2f} / {worst_dad:.2f} ulp")


def test_tpoch_terms_exact_values_and_bad_counts(device):
    la = torch.tensor([-3.0, 0.5, 20.0, -math.inf, 0.0, 0.0, 0.0], dtype=torch.float64)
    n = torch.tensor([0.0, 1.0, 1.0, 5.0, -1.0, math.nan, math.inf], dtype=torch.float64)
    a2t, dad = (t.cpu() for t in ops.tpoch_terms(la.to(device), n.to(device)))
    # n = 0 adds nothing; n = 1: a^2 (-1/a^2) and adpoch(a, 1) = 1 constant;
    # a = 0: the limit -1, 0.
    assert a2t[:4].tolist() == [0.0, -1.0, -1.0, -1.0]
    assert dad[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.isnan(a2t[4:]).all() and torch.isnan(dad[4:]).all()


def test_tpoch_terms_opcheck(device):
    la = torch.randn(37, dtype=torch.float64, device=device)
    n = torch.randint(0, 40, (37,), device=device).double()
    n[::5] += 0.25
    torch.library.opcheck(ops.tpoch_terms.default, (la, n))
    torch.library.opcheck(ops.tpoch_terms.default, (la.float(), n.float()))


def test_tpoch_terms_bad_arguments():
    with pytest.raises(RuntimeError, match="one dtype"):
        ops.tpoch_terms(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="one size"):
        ops.tpoch_terms(torch.zeros(3), torch.zeros(4))


# ---------------------------------------------------------------- problems
def _counts(shape, device, dtype=torch.float64):
    """Small integer counts with a few large (the general path) and
    non-integer ones, never all zero."""
    counts = torch.randint(0, 8, shape).to(dtype)
    flat = counts.view(-1)
    flat[torch.randint(0, flat.numel(), (2,))] = torch.tensor([37.0, 250.0], dtype=dtype)
    flat[torch.randint(0, flat.numel(), (2,))] = torch.tensor([2.5, 0.75], dtype=dtype)
    flat[0] = 3.0
    return counts.to(device)


def _log_alpha(shape, device, dtype=torch.float64):
    la = torch.empty(shape, dtype=torch.float64).uniform_(-2.0, 3.0)
    return la.to(device=device, dtype=dtype).requires_grad_()


LAYOUTS = ["shared", "per_sample"]


def _layout_inputs(layout, device):
    if layout == "shared":
        counts = _counts((6, 5), device)
        return counts, _log_alpha((5,), device)
    counts = _counts((2, 3, 4), device)
    return counts, _log_alpha((2, 3, 4), device)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradgradcheck_log_lik(device, layout, normalize):
    counts, la = _layout_inputs(layout, device)
    assert torch.autograd.gradgradcheck(lambda l: ops.log_lik(counts, l, normalize), (la,))
    assert torch.autograd.gradgradcheck(
        lambda l: dirmult_ext.log_lik(counts, l, normalize=normalize), (la,))
    # Through alpha (the API's log) and a weighted sum.
    w = torch.randn(counts.shape[:-1], dtype=torch.float64, device=device)
    alpha = la.detach().exp().requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda a: (w * dirmult_ext.log_lik(counts, alpha=a, normalize=normalize)).sum(), (alpha,))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_op_gradcheck(device, layout):
    """The backward op's own derivatives, with respect to its incoming
    gradient and to log_alpha (the double backward's two results)."""
    counts, la = _layout_inputs(layout, device)
    grad = torch.randn(counts.shape[:-1], dtype=torch.float64, device=device,
                       requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda g, l: ops.log_lik_backward(g, counts, l, False, False)[0], (grad, la))
    torch.library.opcheck(ops.log_lik_backward.default, (grad, counts, la, False, False))


def test_gradgradcheck_components(device):
    counts = _counts((6, 5), device)
    la = _log_alpha((3, 5), device)
    assert torch.autograd.gradgradcheck(lambda l: ops.log_lik_components(counts, l), (la,))
    assert torch.autograd.gradgradcheck(
        lambda l: dirmult_ext.log_lik_components(counts, l, normalize=True), (la,))
    grad = torch.randn(6, 3, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda g, l: ops.log_lik_components_backward(g, counts, l), (grad, la))
    torch.library.opcheck(ops.log_lik_components_backward.default, (grad, counts, la))


def test_components_double_backward_in_chunks(device, monkeypatch):
    """The components' double backward over several chunks of components
    gives what it gives in one."""
    from dirmult_ext.ops import second_derivatives as _double_backward
    counts = _counts((7, 5), device)
    la = _log_alpha((4, 5), device)
    v = torch.randn(4, 5, dtype=torch.float64, device=device)

    def hvp():
        out = dirmult_ext.log_lik_components(counts, la)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1),
                              dtype=torch.float64).to(device)
        g, = torch.autograd.grad((weights * out).sum(), la, create_graph=True)
        return torch.autograd.grad((g * v).sum(), la)[0]

    whole = hvp()
    monkeypatch.setattr(_double_backward, "_COMPONENT_CHUNK_ELEMENTS", 7 * 5)
    assert _double_backward._component_chunks(7, 4, 5) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    torch.testing.assert_close(hvp(), whole, rtol=1e-13, atol=1e-13)


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not dispatch.FAST_PATH,
                    reason="the single pass is the eager fast path's (DIRMULT_FAST_PATH=0)")
def test_single_pass_second_derivative():
    """Shared log_alpha over 64+ rows on CPU takes the single pass (the
    gradient of the sum from the forward); differentiating that gradient
    again still gives the Hessian."""
    counts = _counts((80, 4), "cpu")
    la = _log_alpha((4,), "cpu")
    with _OpNames() as seen:
        dirmult_ext.log_lik(counts, la, reduction="sum")
    assert "dirmult.log_lik_with_grad.default" in seen.names
    assert torch.autograd.gradgradcheck(
        lambda l: dirmult_ext.log_lik(counts, l, reduction="sum"), (la,))
    # The first gradient is the same with and without create_graph.
    g1, = torch.autograd.grad(dirmult_ext.log_lik(counts, la, reduction="sum"), la)
    g2, = torch.autograd.grad(dirmult_ext.log_lik(counts, la, reduction="sum"), la,
                              create_graph=True)
    torch.testing.assert_close(g2, g1, rtol=1e-12, atol=1e-12 * g1.abs().max().item())
    assert g2.requires_grad


# ----------------------------------------------------------------- Hessians
def _mp_hessian(counts, log_alpha, weights=None):
    """The Hessian of sum_b w_b log p(n_b | exp(log_alpha)) (w_b = 1 unless
    given) with respect to
    log_alpha (V,), by mpmath's numerical differentiation of the lgamma
    formula at 50 digits: independent of the formulas under test."""
    weights = [1.0] * counts.shape[0] if weights is None else weights.tolist()
    weights = [_mpf(w) for w in weights]
    counts = [[_mpf(x) for x in row] for row in counts.tolist()]
    la0 = [_mpf(x) for x in log_alpha.tolist()]
    V = len(la0)

    def f(*la):
        a = [mpmath.exp(x) for x in la]
        A = mpmath.fsum(a)
        total = 0
        for w, row in zip(weights, counts):
            N = mpmath.fsum(row)
            total += w * (mpmath.loggamma(A) - mpmath.loggamma(A + N) + mpmath.fsum(
                mpmath.loggamma(n + x) - mpmath.loggamma(x) for n, x in zip(row, a)))
        return total

    H = torch.empty(V, V, dtype=torch.float64)
    for u in range(V):
        for v in range(u, V):
            order = [0] * V
            order[u] += 1
            order[v] += 1
            H[u, v] = H[v, u] = float(mpmath.diff(f, la0, tuple(order)))
    return H


def _lgamma_sum(counts, log_alpha):
    """The plain lgamma formula in torch float64 (twice differentiable)."""
    a = log_alpha.exp().expand(counts.shape)
    A, N = a.sum(-1), counts.sum(-1)
    return (torch.lgamma(A) - torch.lgamma(A + N)
            + (torch.lgamma(counts + a) - torch.lgamma(a)).sum(-1)).sum()


def _hessian_inputs(device):
    counts = torch.randint(0, 9, (4, 3)).double()
    counts[0, 0] = 2.5
    counts[1, 2] = 30.0
    la = torch.empty(3, dtype=torch.float64).uniform_(-1.5, 2.5)
    return counts.to(device), la.to(device)


@pytest.mark.parametrize("way", ["api", "op", "compile_eager"])
def test_hessian_against_mpmath(device, way):
    counts, la = _hessian_inputs(device)
    if way == "api":
        f = lambda l: dirmult_ext.log_lik(counts, l, reduction="sum")  # noqa: E731
    elif way == "op":
        f = lambda l: ops.log_lik(counts, l, False).sum()  # noqa: E731
    else:
        # Dynamo with the eager backend reaches the registered op and its
        # formulas. (aot_autograd's backends, the default one included, do
        # not run a double backward: a torch limitation.)
        f = torch.compile(lambda l: dirmult_ext.log_lik(counts, l, reduction="sum"),
                          backend="eager", fullgraph=True)
    H = torch.autograd.functional.hessian(f, la).cpu()
    ref = _mp_hessian(counts.cpu(), la.cpu())
    torch.testing.assert_close(H, ref, rtol=1e-12, atol=1e-12 * ref.abs().max().item())


def test_hessian_against_lgamma_formula(device):
    counts, la = _hessian_inputs(device)
    H = torch.autograd.functional.hessian(
        lambda l: dirmult_ext.log_lik(counts, l, reduction="sum"), la).cpu()
    counts, la = counts.cpu(), la.cpu()
    scale = H.abs().max().item()
    # Autograd of the lgamma formula: torch's float64 trigamma is accurate to
    # about 1e-9 (relative, near 1), hence the tolerance.
    auto = torch.autograd.functional.hessian(lambda l: _lgamma_sum(counts, l), la)
    torch.testing.assert_close(H, auto, rtol=0, atol=1e-8 * scale)
    # Central second differences of the float64 lgamma reference (step h:
    # O(h^2) truncation, O(eps / h^2) rounding).
    h, V = 1e-3, la.numel()
    f = lambda l: log_lik_float64(counts, l).sum().item()  # noqa: E731
    fd = torch.empty(V, V, dtype=torch.float64)
    eye = torch.eye(V, dtype=torch.float64) * h
    for u in range(V):
        for v in range(V):
            fd[u, v] = (f(la + eye[u] + eye[v]) - f(la + eye[u] - eye[v])
                        - f(la - eye[u] + eye[v]) + f(la - eye[u] - eye[v])) / (4 * h * h)
    torch.testing.assert_close(H, fd, rtol=0, atol=1e-5 * scale)


def test_hessian_per_sample_and_components_against_mpmath(device):
    counts, la = _hessian_inputs(device)
    # Per-sample: the rows' Hessians on the diagonal blocks.
    la_rows = la.expand(counts.shape).contiguous() + torch.linspace(
        -0.5, 0.5, counts.shape[0], dtype=torch.float64, device=device)[:, None]
    H = torch.autograd.functional.hessian(
        lambda l: dirmult_ext.log_lik(counts, l, reduction="sum"), la_rows).cpu()
    B, V = counts.shape
    for b in range(B):
        for c in range(B):
            block = H[b, :, c, :]
            if b == c:
                ref = _mp_hessian(counts[b:b + 1].cpu(), la_rows[b].cpu())
                torch.testing.assert_close(block, ref, rtol=1e-12,
                                           atol=1e-12 * ref.abs().max().item())
            else:
                assert (block == 0).all()
    # Components: each component's Hessian from its column of weights.
    la_k = torch.stack([la, la.flip(0) - 0.3])
    weights = torch.rand(counts.shape[0], 2, dtype=torch.float64, device=device) + 0.5
    Hk = torch.autograd.functional.hessian(
        lambda l: (weights * dirmult_ext.log_lik_components(counts, l)).sum(), la_k).cpu()
    for k in range(2):
        ref = _mp_hessian(counts.cpu(), la_k[k].cpu(), weights[:, k].cpu())
        torch.testing.assert_close(Hk[k, :, k, :], ref, rtol=1e-12,
                                   atol=1e-12 * ref.abs().max().item())
        assert (Hk[k, :, 1 - k, :] == 0).all()


def test_hessian_float32(device):
    """float32 (on CUDA shared float32 takes the single pass from one row)
    against the float64 Hessian, relative to the size of its entries."""
    counts = _counts((100, 6), device, dtype=torch.float32)
    la = torch.empty(6, dtype=torch.float64).uniform_(-1.0, 2.0).to(device)
    f = lambda l: dirmult_ext.log_lik(counts, l, reduction="sum")  # noqa: E731
    H32 = torch.autograd.functional.hessian(f, la.float()).double().cpu()
    H64 = torch.autograd.functional.hessian(f, la).cpu()
    torch.testing.assert_close(H32, H64, rtol=0, atol=2e-5 * H64.abs().max().item())


def test_rows_with_zero_gradient_do_not_enter(device):
    """A row whose weight is 0 (bad counts in it) leaves the Hessian finite,
    as it leaves the gradient."""
    counts, la = _hessian_inputs(device)
    bad = torch.cat([counts, torch.full_like(counts[:1], math.nan)])
    weights = torch.ones(bad.shape[0], dtype=torch.float64, device=device)
    weights[-1] = 0.0
    H = torch.autograd.functional.hessian(
        lambda l: (weights * dirmult_ext.log_lik(bad, l)).sum(), la)
    ref = torch.autograd.functional.hessian(
        lambda l: dirmult_ext.log_lik(counts, l, reduction="sum"), la)
    torch.testing.assert_close(H, ref, rtol=1e-13, atol=1e-13)


# ------------------------------------------------------------- unsupported
def test_second_derivative_with_respect_to_counts_raises(device):
    counts, la = _layout_inputs("shared", device)
    counts.requires_grad_()
    la = la.detach().requires_grad_()
    out = dirmult_ext.log_lik(counts, la, reduction="sum")
    g_la, g_counts = torch.autograd.grad(out, (la, counts), create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivatives of log_lik with "
                                                   "respect to counts are not supported"):
        torch.autograd.grad(g_counts.sum(), la)
    with pytest.raises(NotImplementedError, match="counts.detach"):
        torch.autograd.grad(g_la.sum(), la)
    # Without requires_grad on counts, the same works.
    g_la, = torch.autograd.grad(dirmult_ext.log_lik(counts.detach(), la, reduction="sum"),
                                la, create_graph=True)
    assert torch.isfinite(torch.autograd.grad(g_la.sum(), la)[0]).all()


def test_components_second_derivative_with_respect_to_counts_raises(device):
    counts = _counts((5, 4), device).requires_grad_()
    la = _log_alpha((2, 4), device)
    grad = torch.randn(5, 2, dtype=torch.float64, device=device)
    g = ops.log_lik_components_backward(grad, counts, la)
    with pytest.raises(NotImplementedError, match="log_lik_components with respect to counts"):
        torch.autograd.grad(g.sum(), la)


def test_third_derivative_raises(device):
    counts, la = _layout_inputs("shared", device)
    g, = torch.autograd.grad(dirmult_ext.log_lik(counts, la, reduction="sum"), la,
                             create_graph=True)
    h, = torch.autograd.grad(g.sum(), la, create_graph=True)
    with pytest.raises(NotImplementedError, match="third derivatives"):
        torch.autograd.grad(h.sum(), la)
