"""dirmult::log_lik_regression: values against the float64 formula on
log_alpha = X @ W + bias (and mpmath where float64 lgammas cancel),
gradients against float64 autograd and gradcheck, P from 1 to above 64,
edge shapes, bad counts, determinism, argument errors."""
import math

import mpmath
import pytest
import torch

import dirmult_ext
from dirmult_ext.ops import checks as _checks, library as _ops

from reference import COUNT_DTYPES, log_lik_float64, magnitudes, mixed_counts, mp_lnpoch, random_counts

# P: one covariate to more than 64.
P_CASES = [1, 16, 64, 65]
EPS = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def _design(B, V, P, device, dtype=torch.float32, bias=True):
    """X (B, P), W (P, V), bias (V,) or None, drawn so that log_alpha stays
    within about (-3, 3)."""
    X = torch.randn(B, P, dtype=torch.float64)
    W = torch.randn(P, V, dtype=torch.float64) * (0.6 / math.sqrt(max(P, 1)))
    b = torch.empty(V, dtype=torch.float64).uniform_(-1.0, 1.5) if bias else None
    cast = lambda t: None if t is None else t.to(dtype=dtype, device=device)  # noqa: E731
    return cast(X), cast(W), cast(b)


def _log_alpha64(X, W, b):
    la = X.detach().double().cpu() @ W.detach().double().cpu()
    return la + b.detach().double().cpu() if b is not None else la


def _reference(counts, X, W, b, normalize=False):
    return log_lik_float64(counts, _log_alpha64(X, W, b), normalize)


def _row_bounds(counts, X, W, b, normalize, dtype):
    """Per-row error bound: the row's magnitudes (reference.tolerance's
    measure) plus each log_alpha's rounding (a few ulps of |bias| + sum_p
    |X_p W_pv|, P terms for the dot product) times its sensitivity |d log_lik
    / d log_alpha|."""
    la = _log_alpha64(X, W, b)
    n = counts.double().cpu()
    a = la.exp()
    A, N = a.sum(-1, keepdim=True), n.sum(-1, keepdim=True)
    sens = (a * (torch.digamma(n + a) - torch.digamma(a))
            - a * (torch.digamma(N + A) - torch.digamma(A))).abs()
    size = X.detach().double().cpu().abs() @ W.detach().double().cpu().abs()
    if b is not None:
        size = size + b.detach().double().cpu().abs()
    P = X.shape[1]
    la_err = (P + 4) * EPS[dtype] * size
    tol = 2e-6 if dtype == torch.float32 else 1e-12
    return tol * magnitudes(counts, la, normalize)[0] + (sens * la_err).sum(-1)


def _check_values(out, counts, X, W, b, normalize):
    ref = _reference(counts, X, W, b, normalize)
    bound = _row_bounds(counts, X, W, b, normalize, X.dtype)
    err = (out.detach().double().cpu() - ref).abs()
    assert (err <= bound + 1e-300).all(), (err - bound).max()


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("P", P_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values(device, P, with_bias, normalize, dtype):
    # V = 50: rows not a multiple of 4 (scalar loads); 1100: long rows.
    for B, V in [(37, 50), (6, 1100)]:
        counts = mixed_counts(B, V, device)
        X, W, b = _design(B, V, P, device, dtype, with_bias)
        out = dirmult_ext.log_lik_regression(counts, X, W, b, normalize=normalize)
        assert out.shape == (B,) and out.dtype == dtype and out.device.type == device.type
        _check_values(out, counts, X, W, b, normalize)


@pytest.mark.parametrize("count_dtype", COUNT_DTYPES)
def test_count_dtypes(device, count_dtype):
    counts = random_counts((23, 40), torch.float32, device)
    X, W, b = _design(23, 40, 5, device)
    out = dirmult_ext.log_lik_regression(counts.to(count_dtype), X, W, b, normalize=True)
    _check_values(out, counts, X, W, b, True)


def test_large_concentrations_against_mpmath(device):
    """log_alpha about 14 (alpha ~ 1e6): float64 lgamma differences lose
    digits there, so the reference is mpmath."""
    V = 6
    counts = torch.tensor([[1, 0, 3, 2, 5, 1], [0, 4, 0, 1, 2, 7]], dtype=torch.float32)
    X = torch.tensor([[1.0, 0.5], [-0.5, 1.0]])
    W = torch.empty(2, V).uniform_(-0.3, 0.3)
    b = torch.full((V,), 13.8)
    out = dirmult_ext.log_lik_regression(counts.to(device), X.to(device), W.to(device),
                                         b.to(device))
    la = (X.double() @ W.double() + b.double())
    for r in range(2):
        a = [mpmath.exp(mpmath.mpf(float(x))) for x in la[r]]
        n = [int(x) for x in counts[r]]
        ref = sum(mp_lnpoch(a[v], n[v]) for v in range(V)) - mp_lnpoch(sum(a), sum(n))
        # Relative to the terms: float32 log_alpha (one ulp of 14 is 1e-6)
        # moves lnpoch(a, n) by about n ulps.
        scale = sum(abs(mp_lnpoch(a[v], n[v])) for v in range(V))
        assert abs(float(out[r]) - float(ref)) <= 1e-5 * float(scale) + 1e-6 * sum(n)


# --------------------------------------------------------------- gradients
def _grads_float64(counts, X, W, b, weights, normalize):
    Xd = X.detach().double().cpu().requires_grad_()
    Wd = W.detach().double().cpu().requires_grad_()
    bd = b.detach().double().cpu().requires_grad_() if b is not None else None
    la = Xd @ Wd + (bd if bd is not None else 0.0)
    out = log_lik_float64(counts, la, normalize)
    wanted = [Xd, Wd] + ([bd] if bd is not None else [])
    return torch.autograd.grad((out * weights.double().cpu()).sum(), wanted)


def _grad_tolerance(device, dtype):
    """Relative to the largest |gradient| of each argument. float32: the
    log_alpha rounding and, on CUDA, cuBLAS's float32 sums over the rows for
    dW (CPU, seen: 3e-7 over 20 draws)."""
    if dtype == torch.float64:
        return 1e-11
    return 2e-6 if device.type == "cpu" else 2e-5


@pytest.mark.parametrize("P", P_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients(device, P, with_bias, dtype):
    for B, V in [(45, 30), (5, 1100)]:
        counts = mixed_counts(B, V, device)
        X, W, b = _design(B, V, P, device, dtype, with_bias)
        leaves = [t.requires_grad_() for t in (X, W, b) if t is not None]
        weights = torch.randn(B, dtype=dtype, device=device)
        weights[::7] = 0.0
        out = dirmult_ext.log_lik_regression(counts, X, W, b, normalize=True)
        got = torch.autograd.grad((out * weights).sum(), leaves)
        ref = _grads_float64(counts, X, W, b, weights, True)
        tol = _grad_tolerance(device, dtype)
        for name, g, r in zip(("X", "W", "bias"), got, ref):
            assert g.shape == r.shape and g.dtype == dtype
            err = (g.double().cpu() - r).abs().max() / r.abs().max().clamp_min(1e-30)
            assert err < tol, (name, float(err))


@pytest.mark.parametrize("P", [1, 3, 65])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gradcheck(device, P, with_bias):
    counts = random_counts((4, 6), torch.float64, device)
    X, W, b = _design(4, 6, P, device, torch.float64, with_bias)
    args = [t.requires_grad_() for t in (X, W, b) if t is not None]

    def f(*a):
        return dirmult_ext.log_lik_regression(counts, *a, normalize=True)
    assert torch.autograd.gradcheck(f, args)


def test_backward_op_without_bias_returns_an_empty_bias_gradient(device):
    counts = random_counts((5, 7), torch.float32, device)
    X, W, _ = _design(5, 7, 3, device, bias=False)
    dX, dW, db = torch.ops.dirmult.log_lik_regression_backward(
        torch.ones(5, device=device), counts, X, W, None, False)
    assert dX.shape == (5, 3) and dW.shape == (3, 7) and db.shape == (0,)


def test_no_gradient_with_respect_to_counts(device):
    counts = random_counts((5, 7), torch.float32, device).requires_grad_()
    X, W, b = _design(5, 7, 3, device)
    W.requires_grad_()
    out = dirmult_ext.log_lik_regression(counts, X, W, b)
    with pytest.raises(NotImplementedError, match="no gradient with respect to counts"):
        out.sum().backward()


def test_reduction(device):
    counts = random_counts((11, 9), torch.float32, device)
    X, W, b = _design(11, 9, 4, device)
    rows = dirmult_ext.log_lik_regression(counts, X, W, b)
    torch.testing.assert_close(dirmult_ext.log_lik_regression(counts, X, W, b, reduction="sum"),
                               rows.sum())
    torch.testing.assert_close(dirmult_ext.log_lik_regression(counts, X, W, b, reduction="mean"),
                               rows.sum() / 11)


def test_float64_argument_promotes(device):
    counts = random_counts((8, 9), torch.float32, device)
    X, W, b = _design(8, 9, 3, device)
    out = dirmult_ext.log_lik_regression(counts, X, W.double(), b)
    assert out.dtype == torch.float64
    _check_values(out, counts, X.double(), W.double(), b.double(), False)


# ------------------------------------------------------------- edge shapes
def test_no_rows(device):
    counts = torch.zeros(0, 9, device=device)
    X, W, b = _design(0, 9, 4, device)
    W.requires_grad_(), b.requires_grad_()
    out = dirmult_ext.log_lik_regression(counts, X, W, b)
    assert out.shape == (0,)
    gW, gb = torch.autograd.grad(out.sum(), (W, b))
    assert (gW == 0).all() and (gb == 0).all()


def test_one_category(device):
    """V = 1: the row's term and the total's cancel, log_lik = 0 and its
    gradient 0, up to rounding of the same two terms."""
    counts = random_counts((13, 1), torch.float32, device, zero_frac=0.0) + 1
    X, W, b = _design(13, 1, 4, device)
    W.requires_grad_()
    out = dirmult_ext.log_lik_regression(counts, X, W, b, normalize=True)
    mag = magnitudes(counts, _log_alpha64(X, W, b), True)[0]
    assert (out.double().cpu().abs() <= 4e-6 * mag + 1e-6).all()
    gW, = torch.autograd.grad(out.sum(), W)
    assert gW.abs().max() < 1e-4 * counts.sum().item()


def test_no_covariates(device):
    """P = 0: log_alpha is the bias, log_lik's shared-alpha value."""
    counts = random_counts((10, 12), torch.float32, device)
    X = torch.zeros(10, 0, device=device)
    W = torch.zeros(0, 12, device=device)
    b = torch.randn(12, device=device)
    out = dirmult_ext.log_lik_regression(counts, X, W, b)
    ref = log_lik_float64(counts, b)
    assert (out.double().cpu() - ref).abs().max() <= 2e-6 * magnitudes(counts, b)[0].max()


def test_no_categories(device):
    counts = torch.zeros(4, 0, device=device)
    X, W, b = _design(4, 0, 3, device)
    assert (dirmult_ext.log_lik_regression(counts, X, W, b) == 0).all()


# -------------------------------------------------------------- bad counts
def test_bad_counts_give_nan_rows_and_zero_weight_rows_add_nothing(device):
    counts = random_counts((20, 9), torch.float32, device)
    counts[3, 2] = -1.0
    counts[7, 5] = float("nan")
    X, W, b = _design(20, 9, 4, device)
    out = dirmult_ext.log_lik_regression(counts, X, W, b)
    bad = torch.zeros(20, dtype=torch.bool)
    bad[[3, 7]] = True
    assert out.cpu()[bad].isnan().all() and out.cpu()[~bad].isfinite().all()
    W.requires_grad_()
    weights = (~bad).to(device=device, dtype=torch.float32)
    gW, = torch.autograd.grad((dirmult_ext.log_lik_regression(counts, X, W, b) * weights).sum(), W)
    keep = (~bad).nonzero().flatten().to(device)
    W2 = W.detach().clone().requires_grad_()
    ref, = torch.autograd.grad(
        dirmult_ext.log_lik_regression(counts[keep], X[keep], W2, b).sum(), W2)
    assert gW.isfinite().all()
    torch.testing.assert_close(gW, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- determinism
def _run_all(counts, X, W, b, weights):
    leaves = [t.detach().clone().requires_grad_() for t in (X, W, b)]
    out = dirmult_ext.log_lik_regression(counts, *leaves, normalize=True)
    return (out,) + torch.autograd.grad((out * weights).sum(), leaves)


@pytest.mark.parametrize("P", [16, 65])
def test_bitwise_deterministic(device, P):
    B, V = 3000, 70
    counts = random_counts((B, V), torch.float32, device)
    X, W, b = _design(B, V, P, device)
    weights = torch.randn(B, device=device)
    first = _run_all(counts, X, W, b, weights)
    second = _run_all(counts, X, W, b, weights)
    for x, y in zip(first, second):
        assert torch.equal(x, y)


def test_cpu_results_do_not_depend_on_the_thread_count():
    B, V, P = 5000, 40, 7
    counts = random_counts((B, V), torch.float32, "cpu")
    X, W, b = _design(B, V, P, "cpu")
    weights = torch.randn(B)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run_all(counts, X, W, b, weights)
        torch.set_num_threads(max(2, threads))
        many = _run_all(counts, X, W, b, weights)
    finally:
        torch.set_num_threads(threads)
    for x, y in zip(one, many):
        assert torch.equal(x, y)


# ------------------------------------------------------------------ errors
API_ERRORS = {
    "counts rank": (lambda c, X, W, b: (c[0], X, W, b), ValueError, r"counts must have shape \(B, V\)"),
    "X rank": (lambda c, X, W, b: (c, X[0], W, b), ValueError, r"X must have shape \(B, P\)"),
    "W rank": (lambda c, X, W, b: (c, X, W[0], b), ValueError, r"W must have shape \(P, V\)"),
    "B": (lambda c, X, W, b: (c, X[:-1], W, b), ValueError, r"one row per row of counts \(B=6\)"),
    "P": (lambda c, X, W, b: (c, X, W[:-1], b), ValueError, r"one row per column of X \(P=3\)"),
    "V": (lambda c, X, W, b: (c, X, W[:, :-1], b), ValueError,
          r"one column per category of counts \(V=8\)"),
    "bias shape": (lambda c, X, W, b: (c, X, W, b[:-1]), ValueError, r"bias must have shape \(8,\)"),
    "X dtype": (lambda c, X, W, b: (c, X.long(), W, b), ValueError,
                "X must be a floating-point tensor"),
    "counts dtype": (lambda c, X, W, b: (c.bool(), X, W, b), ValueError, "counts must have dtype"),
    "sparse counts": (lambda c, X, W, b: (c.to_sparse_csr(), X, W, b), ValueError,
                      "dense .strided. counts only"),
    "not a tensor": (lambda c, X, W, b: (c, X.tolist(), W, b), TypeError,
                     "X must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", API_ERRORS)
def test_api_errors(device, case):
    make, kind, message = API_ERRORS[case]
    counts = random_counts((6, 8), torch.float32, device)
    X, W, b = _design(6, 8, 3, device)
    with pytest.raises(kind, match=message):
        dirmult_ext.log_lik_regression(*make(counts, X, W, b))


def test_api_device_error():
    if not torch.cuda.is_available():
        pytest.skip("needs a second device")
    counts = random_counts((6, 8), torch.float32, "cpu")
    X, W, b = _design(6, 8, 3, "cpu")
    with pytest.raises(ValueError, match="counts and W must be on the same device"):
        dirmult_ext.log_lik_regression(counts, X, W.cuda(), b)


# The ops' checks (C++ in this process on torch >= 2.13, and their Python
# twins; tests/test_errors.py runs cases in processes with the Python checks
# in front of the kernels).
OP_ERRORS = {
    "counts rank": ("(c[0], X, W, b, False)", r"counts must be \(B, V\) for log_lik_regression"),
    "X rank": ("(c, X[0], W, b, False)", r"X must be \(B, P\) for log_lik_regression"),
    "W rank": ("(c, X, W[0], b, False)", r"W must be \(P, V\) for log_lik_regression"),
    "X dtype": ("(c, X.half(), W.half(), b, False)", "X must be float32 or float64"),
    "W dtype": ("(c, X, W.double(), b, False)", "W must have X's dtype"),
    "bias dtype": ("(c, X, W, b.double(), False)", "bias must have X's dtype"),
    "B": ("(c, X[:-1], W, b, False)", "X has 5 rows but counts has B=6"),
    "P": ("(c, X, W[:-1], b, False)", "W has 2 rows but X has P=3 columns"),
    "V": ("(c, X, W[:, :-1], b, False)", "W has 7 columns but counts has V=8"),
    "bias shape": ("(c, X, W, b[:-1], False)", r"bias must be \(V,\) with V=8"),
    "counts dtype": ("(c.bool(), X, W, b, False)", "counts must be float32, float64"),
    "grad shape": ("(g[:-1], c, X, W, b, False)", r"grad must be \(B,\) with B=6"),
    "grad dtype": ("(g.double(), c, X, W, None, False)", "grad must have X's dtype"),
}


@pytest.mark.parametrize("case", OP_ERRORS)
def test_op_errors(device, case):
    args_code, message = OP_ERRORS[case]
    counts = random_counts((6, 8), torch.float32, device)
    X, W, b = _design(6, 8, 3, device)
    g = torch.ones(6, device=device)
    args = eval(args_code, {"c": counts, "X": X, "W": W, "b": b, "g": g})
    name = "log_lik_regression_backward" if case.startswith("grad") else "log_lik_regression"
    with pytest.raises(RuntimeError, match=message):
        _checks.OP_CHECKS[name](*args)
    if _ops.STABLE_ABI_ERRORS_RAISE or _ops.OP_CHECKS == "python":
        with pytest.raises(RuntimeError, match=message):
            getattr(torch.ops.dirmult, name)(*args)
