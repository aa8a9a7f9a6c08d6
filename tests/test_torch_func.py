"""The public functions under the torch.func transforms (grad,
grad_and_value, jacrev, jacfwd, hessian, vmap and their compositions),
against the same transforms of the float64 lgamma formula
(reference.log_lik_float64), plain autograd of it, and the ops' batching
rules against a loop over the batch. See Note [torch.func]."""
import pytest
import torch
from torch.func import grad, grad_and_value, hessian, jacfwd, jacrev, vmap

import dirmult_ext
from reference import components_float64, log_lik_float64, random_counts, random_sparse_counts

ops = torch.ops.dirmult
DTYPES = [torch.float64, torch.float32]


def _tol(dtype, order):
    # Relative to the largest entry of the reference: float64 to the lgamma
    # formula's own rounding (its second derivatives, differences of
    # trigammas, are good to about 1e-9), float32 to the accumulation over a
    # few dozen terms.
    if dtype == torch.float64:
        return 1e-10 if order == 1 else 1e-8
    return 2e-5 if order == 1 else 1e-4


def _close(actual, expected, dtype, order=1, scale=None):
    expected = expected.double()
    scale = expected.abs().max().clamp_min(1.0) if scale is None else scale
    err = (actual.double() - expected).abs().max()
    assert err <= _tol(dtype, order) * scale, f"max error {err:.3g} at scale {scale:.3g}"


def _autograd_hessian(f, x):
    """The Hessian by plain autograd (double backward) of the public function."""
    x = x.detach().clone().requires_grad_()
    g, = torch.autograd.grad(f(x), x, create_graph=True)
    rows = [torch.autograd.grad(gi, x, retain_graph=True)[0] for gi in g.reshape(-1)]
    return torch.stack(rows).reshape(x.shape + x.shape)


def _draw(B, V, dtype, per_sample=False):
    counts = random_counts((B, V), dtype, "cpu", high=12, zero_frac=0.4)
    shape = (B, V) if per_sample else (V,)
    return counts, torch.empty(shape, dtype=dtype).uniform_(-1.5, 1.5)


def _ref(counts, normalize=False):
    return lambda la: log_lik_float64(counts, la, normalize)


# ----------------------------------------------------------------- log_lik
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalize", [False, True])
def test_log_lik_first_derivatives(dtype, normalize):
    counts, la = _draw(9, 6, dtype)
    weights = torch.rand(9, dtype=torch.float64) + 0.5

    def f(la):
        return (dirmult_ext.log_lik(counts, la, normalize=normalize) * weights.to(dtype)).sum()

    def f_ref(la):
        return (log_lik_float64(counts, la, normalize) * weights).sum()

    la64 = la.double()
    _close(grad(f)(la), grad(f_ref)(la64), dtype)
    g, value = grad_and_value(f)(la)
    _close(g, grad(f_ref)(la64), dtype)
    _close(value, f_ref(la64), dtype)
    expected_jac = jacrev(_ref(counts, normalize))(la64)
    _close(jacrev(lambda x: dirmult_ext.log_lik(counts, x, normalize=normalize))(la),
           expected_jac, dtype)
    _close(jacfwd(lambda x: dirmult_ext.log_lik(counts, x, normalize=normalize))(la),
           expected_jac, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_log_lik_hessian_shared_and_per_sample(dtype):
    counts, la = _draw(7, 5, dtype)
    f = lambda x: dirmult_ext.log_lik(counts, x, reduction="sum")  # noqa: E731
    f_ref = lambda x: log_lik_float64(counts, x).sum()  # noqa: E731
    expected = torch.autograd.functional.hessian(f_ref, la.double())
    _close(hessian(f)(la), expected, dtype, 2)
    _close(jacrev(jacrev(f))(la), expected, dtype, 2)
    # The same formulas as plain autograd's double backward.
    torch.testing.assert_close(hessian(f)(la), _autograd_hessian(f, la))
    # Per-sample concentrations: the Hessian is block-diagonal over the rows.
    counts, la = _draw(4, 3, dtype, per_sample=True)
    f = lambda x: dirmult_ext.log_lik(counts, x).sum()  # noqa: E731
    expected = torch.autograd.functional.hessian(lambda x: log_lik_float64(counts, x).sum(),
                                                 la.double())
    _close(hessian(f)(la), expected, dtype, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_sample_gradients_by_vmap_of_grad(dtype):
    counts, la = _draw(11, 7, dtype)
    per_row = vmap(grad(lambda x, row: dirmult_ext.log_lik(row, x)), in_dims=(None, 0))(la, counts)
    assert per_row.shape == (11, 7)
    for b in range(11):
        x = la.double().clone().requires_grad_()
        expected, = torch.autograd.grad(log_lik_float64(counts[b], x), x)
        _close(per_row[b], expected, dtype)
    # Per-sample Hessians too.
    per_row_h = vmap(hessian(lambda x, row: dirmult_ext.log_lik(row, x)), in_dims=(None, 0))(
        la, counts)
    for b in (0, 10):
        _close(per_row_h[b], torch.autograd.functional.hessian(
            lambda x: log_lik_float64(counts[b], x), la.double()), dtype, 2)


def test_vmap_over_concentrations_and_counts_gradient():
    counts, _ = _draw(8, 5, torch.float64)
    las = torch.randn(4, 5, dtype=torch.float64)
    f = lambda x: dirmult_ext.log_lik(counts, x, reduction="sum")  # noqa: E731
    f_ref = lambda x: log_lik_float64(counts, x).sum()  # noqa: E731
    _close(vmap(f)(las), torch.stack([f_ref(x) for x in las]), torch.float64)
    _close(vmap(grad(f))(las), torch.stack([grad(f_ref)(x) for x in las]), torch.float64)
    _close(vmap(hessian(f))(las), torch.stack([hessian(f_ref)(x) for x in las]), torch.float64,
           2)
    # With respect to floating counts (first order).
    la = las[0]
    g = grad(lambda c: dirmult_ext.log_lik(c, la, normalize=True).sum())(counts)
    _close(g, grad(lambda c: log_lik_float64(c, la, True).sum())(counts), torch.float64)
    _close(jacfwd(lambda c: dirmult_ext.log_lik(c, la))(counts),
           jacrev(lambda c: log_lik_float64(c, la))(counts), torch.float64)


def test_unsupported_derivatives_raise():
    counts, la = _draw(5, 4, torch.float64)
    f = lambda x: dirmult_ext.log_lik(counts, x).sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match="third derivatives"):
        jacrev(hessian(f))(la)
    with pytest.raises(NotImplementedError, match="counts"):
        jacrev(grad(lambda c: dirmult_ext.log_lik(c, la).sum()))(counts)
    _close(jacrev(jacfwd(f))(la), hessian(lambda x: log_lik_float64(counts, x).sum())(la),
           torch.float64, 2)


# ------------------------------------------------------- log_lik_components
@pytest.mark.parametrize("dtype", DTYPES)
def test_components(dtype):
    counts = random_counts((10, 5), dtype, "cpu", high=12, zero_frac=0.4)
    la = torch.empty(3, 5, dtype=dtype).uniform_(-1.5, 1.5)
    weights = torch.rand(10, 3, dtype=torch.float64)

    def f(x):
        return (dirmult_ext.log_lik_components(counts, x) * weights.to(dtype)).sum()

    def f_ref(x):
        return (components_float64(counts, x) * weights).sum()

    la64 = la.double()
    _close(grad(f)(la), grad(f_ref)(la64), dtype)
    expected_jac = jacrev(lambda x: components_float64(counts, x))(la64)
    _close(jacrev(lambda x: dirmult_ext.log_lik_components(counts, x))(la), expected_jac, dtype)
    _close(jacfwd(lambda x: dirmult_ext.log_lik_components(counts, x))(la), expected_jac, dtype)
    expected_h = torch.autograd.functional.hessian(f_ref, la64)
    _close(hessian(f)(la), expected_h, dtype, 2)
    _close(jacrev(jacrev(f))(la), expected_h, dtype, 2)
    # Per-sample gradients of the mixture's log-likelihood (log-sum-exp over
    # the components) by vmap over the rows.
    per_row = vmap(grad(lambda x, row: dirmult_ext.log_lik_components(row[None], x)
                        .logsumexp(-1).sum()), in_dims=(None, 0))(la, counts)
    for b in (0, 4, 9):
        expected = grad(lambda x: components_float64(counts[b:b + 1], x).logsumexp(-1).sum())(la64)
        _close(per_row[b], expected, dtype)
    # A batch of component sets.
    batch = torch.empty(2, 3, 5, dtype=dtype).uniform_(-1, 1)
    _close(vmap(grad(f))(batch), torch.stack([grad(f_ref)(x.double()) for x in batch]), dtype)


# ------------------------------------------------------- log_lik_regression
@pytest.mark.parametrize("dtype", DTYPES)
def test_regression(dtype):
    B, P, V = 9, 3, 4
    counts = random_counts((B, V), dtype, "cpu", high=12, zero_frac=0.3)
    X = torch.randn(B, P, dtype=dtype)
    W = torch.randn(P, V, dtype=dtype) * 0.4
    bias = torch.randn(V, dtype=dtype) * 0.4

    def f(X, W, bias):
        return dirmult_ext.log_lik_regression(counts, X, W, bias, reduction="sum")

    def f_ref(X, W, bias):
        return log_lik_float64(counts, X @ W + bias).sum()

    args64 = (X.double(), W.double(), bias.double())
    for actual, expected in zip(grad(f, argnums=(0, 1, 2))(X, W, bias),
                                grad(f_ref, argnums=(0, 1, 2))(*args64)):
        _close(actual, expected, dtype)
    expected_jac = jacrev(lambda w: log_lik_float64(counts, args64[0] @ w + args64[2]))(args64[1])
    rows = lambda w: dirmult_ext.log_lik_regression(counts, X, w, bias)  # noqa: E731
    _close(jacrev(rows)(W), expected_jac, dtype)
    _close(jacfwd(rows)(W), expected_jac, dtype)
    expected_h = torch.autograd.functional.hessian(lambda w: f_ref(args64[0], w, args64[2]),
                                                   args64[1])
    _close(hessian(lambda w: f(X, w, bias))(W), expected_h, dtype, 2)
    # Per-sample gradients with respect to the coefficients.
    per_row = vmap(grad(lambda w, b, x, c: dirmult_ext.log_lik_regression(
        c[None], x[None], w, b).sum(), argnums=(0, 1)), in_dims=(None, None, 0, 0))(
        W, bias, X, counts)
    for b in (0, 5):
        expected = grad(lambda w, c: log_lik_float64(counts[b], args64[0][b] @ w + c),
                        argnums=(0, 1))(args64[1], args64[2])
        _close(per_row[0][b], expected[0], dtype)
        _close(per_row[1][b], expected[1], dtype)


# ------------------------------------------------------------ sparse counts
@pytest.mark.parametrize("components", [False, True])
def test_sparse_counts(components):
    dense = random_sparse_counts(12, 8, 0.3, torch.float64)
    sparse = dirmult_ext.SparseCounts.from_dense(dense)
    shape = (3, 8) if components else (8,)
    la = torch.empty(shape, dtype=torch.float64).uniform_(-1, 1)
    if components:
        public = lambda c, x: dirmult_ext.log_lik_components(c, x)  # noqa: E731
        ref = lambda x: components_float64(dense, x)  # noqa: E731
    else:
        public = lambda c, x: dirmult_ext.log_lik(c, x)  # noqa: E731
        ref = lambda x: log_lik_float64(dense, x)  # noqa: E731
    _close(grad(lambda x: public(sparse, x).sum())(la), grad(lambda x: ref(x).sum())(la),
           torch.float64)
    expected_jac = jacrev(ref)(la)
    _close(jacrev(lambda x: public(sparse, x))(la), expected_jac, torch.float64)
    _close(jacfwd(lambda x: public(sparse, x))(la), expected_jac, torch.float64)
    batch = torch.stack([la, la * 0.5 - 0.3])
    _close(vmap(grad(lambda x: public(sparse, x).sum()))(batch),
           torch.stack([grad(lambda x: ref(x).sum())(x) for x in batch]), torch.float64)
    expected_h = hessian(lambda x: ref(x).sum())(la)
    _close(hessian(lambda x: public(sparse, x).sum())(la), expected_h, torch.float64, 2)
    _close(jacrev(jacrev(lambda x: public(sparse, x).sum()))(la), expected_h, torch.float64, 2)


@pytest.mark.parametrize("layout", ["csr", "csc", "coo"])
def test_raw_torch_sparse_counts(layout):
    """A torch sparse tensor as counts, closed over by the transforms."""
    dense = random_sparse_counts(10, 6, 0.4, torch.float64)
    sparse = {"csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc,
              "coo": dense.to_sparse}[layout]()
    la = torch.empty(6, dtype=torch.float64).uniform_(-1, 1)
    f = lambda x: dirmult_ext.log_lik(sparse, x, reduction="sum")  # noqa: E731
    f_ref = lambda x: log_lik_float64(dense, x).sum()  # noqa: E731
    _close(grad(f)(la), grad(f_ref)(la), torch.float64)
    rows = lambda x: dirmult_ext.log_lik(sparse, x)  # noqa: E731
    expected_jac = jacrev(lambda x: log_lik_float64(dense, x))(la)
    _close(jacrev(rows)(la), expected_jac, torch.float64)
    _close(jacfwd(rows)(la), expected_jac, torch.float64)
    _close(hessian(f)(la), hessian(f_ref)(la), torch.float64, 2)
    batch = torch.empty(3, 6, dtype=torch.float64).uniform_(-1, 1)
    _close(vmap(f)(batch), torch.stack([f_ref(x) for x in batch]), torch.float64)
    comps = torch.empty(2, 6, dtype=torch.float64).uniform_(-1, 1)
    _close(grad(lambda x: dirmult_ext.log_lik_components(sparse, x).sum())(comps),
           grad(lambda x: components_float64(dense, x).sum())(comps), torch.float64)


def test_vmap_over_a_batch_of_sparse_tensors_raises():
    dense = torch.stack([random_sparse_counts(4, 5, 0.5, torch.float64) for _ in range(2)])
    la = torch.randn(5, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="vmap over a batch of sparse"):
        vmap(lambda c: dirmult_ext.log_lik(c, la))(dense.to_sparse())


# ------------------------------------------------------------- forward mode
def _forward_cases():
    """(name, f, f_ref, x): f a function of one tensor by the public
    functions, f_ref the float64 formula, x the point (float64)."""
    counts = random_counts((7, 5), torch.float64, "cpu", high=12, zero_frac=0.4)
    dense = random_sparse_counts(9, 5, 0.4, torch.float64)
    sparse = dirmult_ext.SparseCounts.from_dense(dense)
    X = torch.randn(7, 3, dtype=torch.float64)
    bias = torch.randn(5, dtype=torch.float64) * 0.4
    w = torch.rand(7, dtype=torch.float64) + 0.5
    la = torch.empty(5, dtype=torch.float64).uniform_(-1.5, 1.5)
    per_sample = torch.empty(7, 5, dtype=torch.float64).uniform_(-1.5, 1.5)
    comps = torch.empty(3, 5, dtype=torch.float64).uniform_(-1.5, 1.5)
    W = torch.randn(3, 5, dtype=torch.float64) * 0.4
    return [
        ("log_lik", lambda x: dirmult_ext.log_lik(counts, x, normalize=True) * w,
         lambda x: log_lik_float64(counts, x, True) * w, la),
        ("log_lik per-sample", lambda x: dirmult_ext.log_lik(counts, x).sum(),
         lambda x: log_lik_float64(counts, x).sum(), per_sample),
        ("log_lik_components", lambda x: dirmult_ext.log_lik_components(counts, x).logsumexp(-1),
         lambda x: components_float64(counts, x).logsumexp(-1), comps),
        ("log_lik_regression", lambda x: dirmult_ext.log_lik_regression(counts, X, x, bias),
         lambda x: log_lik_float64(counts, X @ x + bias), W),
        ("sparse log_lik", lambda x: dirmult_ext.log_lik(sparse, x),
         lambda x: log_lik_float64(dense, x), la),
        ("sparse log_lik_components",
         lambda x: dirmult_ext.log_lik_components(sparse, x).logsumexp(-1),
         lambda x: components_float64(dense, x).logsumexp(-1), comps),
    ]


def _forward_ad(f, x, t):
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        return fwAD.unpack_dual(f(fwAD.make_dual(x, t))).tangent


def _scalar(f):
    return lambda x: f(x).sum()


_COMPOSITIONS = {
    # name: (the transform of f at x along tangent t, order)
    "jacfwd": (lambda f, x, t: jacfwd(f)(x), 1),
    "jvp": (lambda f, x, t: torch.func.jvp(f, (x,), (t,))[1], 1),
    "forward_ad": (lambda f, x, t: _forward_ad(f, x, t), 1),
    "vmap(jacfwd)": (lambda f, x, t: vmap(jacfwd(f))(torch.stack([x, x + t])), 1),
    "jacfwd(jacfwd)": (lambda f, x, t: jacfwd(jacfwd(_scalar(f)))(x), 2),
    "jacfwd(jacrev)": (lambda f, x, t: jacfwd(jacrev(_scalar(f)))(x), 2),
    "jacrev(jacfwd)": (lambda f, x, t: jacrev(jacfwd(_scalar(f)))(x), 2),
    "hessian": (lambda f, x, t: hessian(_scalar(f))(x), 2),
    "jvp(jvp)": (lambda f, x, t: torch.func.jvp(
        lambda y: torch.func.jvp(_scalar(f), (y,), (t,))[1], (x,), (t,))[1], 2),
    "jvp(grad)": (lambda f, x, t: torch.func.jvp(grad(_scalar(f)), (x,), (t,))[1], 2),
    "forward_ad(jacrev)": (lambda f, x, t: _forward_ad(jacrev(_scalar(f)), x, t), 2),
    "vmap(jacfwd(jacfwd))": (lambda f, x, t: vmap(jacfwd(jacfwd(_scalar(f))))(
        torch.stack([x, x - t])), 2),
}


_CONTRACTED = ("jvp(jvp)",)


@pytest.mark.parametrize("composition", list(_COMPOSITIONS))
def test_forward_mode_compositions(composition):
    """Every op under every forward-mode composition against the same
    composition of the float64 formula (never zeros)."""
    transform, order = _COMPOSITIONS[composition]
    for name, f, f_ref, x in _forward_cases():
        t = torch.randn_like(x)
        expected = transform(f_ref, x, t)
        assert expected.abs().max() > 0.1, name
        actual = transform(f, x, t)
        assert actual.shape == expected.shape, name
        scale = None
        if composition in _CONTRACTED:
            # A Hessian contracted with tangents: relative to the terms summed.
            H = hessian(_scalar(f_ref))(x).reshape(x.numel(), x.numel())
            scale = (t.reshape(-1).abs() @ H.abs() @ t.reshape(-1).abs()).clamp_min(1.0)
        try:
            _close(actual, expected, torch.float64, order, scale)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_forward_ad_with_respect_to_counts():
    counts, la = _draw(6, 4, torch.float64)
    t = torch.randn_like(counts)
    f = lambda c: dirmult_ext.log_lik(c, la, normalize=True)  # noqa: E731
    _close(_forward_ad(f, counts, t), _forward_ad(lambda c: log_lik_float64(c, la, True),
                                                   counts, t), torch.float64)


def test_third_derivatives_by_forward_mode_raise():
    counts, la = _draw(5, 4, torch.float64)
    f = lambda x: dirmult_ext.log_lik(counts, x).sum()  # noqa: E731
    for third in (jacfwd(jacfwd(jacfwd(f))), jacfwd(hessian(f)), jacrev(jacfwd(jacfwd(f)))):
        with pytest.raises(NotImplementedError, match="third derivatives"):
            third(la)
    sparse = dirmult_ext.SparseCounts.from_dense(counts)
    with pytest.raises(NotImplementedError, match="third derivatives"):
        jacfwd(jacfwd(jacfwd(lambda x: dirmult_ext.log_lik(sparse, x).sum())))(la)


# ----------------------------------------------------- the batching rules
def test_batching_rules_match_a_loop():
    counts, _ = _draw(6, 5, torch.float64)
    las = torch.randn(3, 5, dtype=torch.float64)
    g = torch.rand(3, 6, dtype=torch.float64)
    loop = torch.stack([ops.log_lik(counts, x) for x in las])
    _close(vmap(lambda x: ops.log_lik(counts, x))(las), loop, torch.float64)
    for counts_grad in (False, True):
        out = vmap(lambda gg, x: ops.log_lik_backward(gg, counts, x, False, counts_grad))(g, las)
        for i in range(3):
            ref = ops.log_lik_backward(g[i], counts, las[i], False, counts_grad)
            _close(out[0][i], ref[0], torch.float64)
            if counts_grad:
                _close(out[1][i], ref[1], torch.float64)
    # Batched rows against shared concentrations: per-batch gradients.
    rows = torch.stack([counts, counts.flip(0)])
    out, _ = vmap(lambda c: ops.log_lik_backward(g[0], c, las[0], False, False))(rows)
    for i in range(2):
        _close(out[i], ops.log_lik_backward(g[0], rows[i], las[0], False, False)[0],
               torch.float64)
    comps = torch.randn(2, 4, 5, dtype=torch.float64)
    _close(vmap(lambda x: ops.log_lik_components(counts, x))(comps),
           torch.stack([ops.log_lik_components(counts, x) for x in comps]), torch.float64)
    _close(vmap(lambda c: ops.log_lik_components(c, comps[0]))(rows),
           torch.stack([ops.log_lik_components(c, comps[0]) for c in rows]), torch.float64)
    terms = vmap(ops.tpoch_terms, in_dims=(0, None))(las, counts[0])
    for i in range(3):
        _close(terms[1][i], ops.tpoch_terms(las[i], counts[0])[1], torch.float64)
