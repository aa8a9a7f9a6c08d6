"""Finite log_alpha beyond the dtype's exp range (alpha underflows to 0 or
overflows to inf) and integer counts that float32 does not hold: values and
gradients against mpmath, dense (shared and per-sample alpha), components,
sparse CSR and the distribution's log_prob, on every device under test."""
import math

import mpmath
import pytest
import torch

import dirmult_ext as dm

# Ranges where exp(log_alpha) leaves the dtype: float32 below about -87
# (subnormal, then 0 below -104) and above 88.7; float64 below -708 and
# above 709.
EXTREME = {
    torch.float32: [(-300.0, -90.0), (89.0, 300.0)],
    torch.float64: [(-1000.0, -709.0), (710.0, 1000.0)],
}
TOL = {torch.float32: 4e-6, torch.float64: 1e-12}


def _a(la):
    return mpmath.exp(mpmath.mpf(float(la)))


def _dps(la_max):
    # lnpoch(a, n) of a huge a is the difference of two numbers of about
    # a log a: enough digits for the n log a left.
    return 40 + int(max(0.0, la_max) / 2.0)


def mp_row(counts, log_alpha):
    """(value, gradient wrt log_alpha, magnitude) of one row, in mpmath."""
    las = [float(x) for x in log_alpha]
    ns = [float(x) for x in counts]
    with mpmath.workdps(_dps(max(las))):
        a = [_a(x) for x in las]
        A = mpmath.fsum(a)
        N = mpmath.fsum(ns)

        def lnpoch(x, n):
            return mpmath.loggamma(x + n) - mpmath.loggamma(x) if n else mpmath.mpf(0)

        def adpoch(x, n):
            return x * (mpmath.digamma(x + n) - mpmath.digamma(x)) if n else mpmath.mpf(0)

        terms = [lnpoch(x, n) for x, n in zip(a, ns)]
        row = lnpoch(A, N)
        value = mpmath.fsum(terms) - row
        adA = adpoch(A, N)
        grad = [adpoch(x, n) - x / A * adA for x, n in zip(a, ns)]
        mag = mpmath.fsum(abs(t) for t in terms) + abs(row)
        gmag = [abs(adpoch(x, n)) + abs(x / A * adA) + 1 for x, n in zip(a, ns)]
        return float(value), [float(g) for g in grad], float(mag), [float(m) for m in gmag]


def draw_log_alpha(shape, dtype, gen, mixed):
    """log_alpha in the dtype's extreme ranges (both ends in a row), or with
    mixed=True a part of it of moderate size."""
    lo_rng, hi_rng = EXTREME[dtype]
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    low = lo_rng[0] + (lo_rng[1] - lo_rng[0]) * u
    high = hi_rng[0] + (hi_rng[1] - hi_rng[0]) * u
    pick = torch.rand(shape, generator=gen) < 0.5
    la = torch.where(pick, low, high)
    if mixed:
        normal = -3 + 6 * torch.rand(shape, generator=gen, dtype=torch.float64)
        la = torch.where(torch.rand(shape, generator=gen) < 0.4, normal, la)
    return la.to(dtype)


def draw_counts(shape, gen, fractional=False):
    c = torch.randint(0, 25, shape, generator=gen).to(torch.float64)
    c = c * (torch.rand(shape, generator=gen) < 0.7)
    if fractional:
        c = c + 0.5 * (c > 0) * (torch.rand(shape, generator=gen) < 0.3)
    c[..., 0] = c[..., 0] + 1  # never an empty row
    return c


def check_rows(out, grad, counts, log_alpha, dtype, weights):
    """out (B,), grad like log_alpha (summed over rows for a shared one)."""
    B = counts.shape[0]
    shared = log_alpha.dim() == 1
    gref = torch.zeros(log_alpha.shape, dtype=torch.float64)
    gmag = torch.zeros(log_alpha.shape, dtype=torch.float64)
    for b in range(B):
        la_b = log_alpha if shared else log_alpha[b]
        v, g, mag, gm = mp_row(counts[b].tolist(), la_b.tolist(), )
        assert math.isfinite(float(out[b])), (b, out[b])
        assert abs(float(out[b]) - v) <= TOL[dtype] * mag, (b, float(out[b]), v, mag)
        w = float(weights[b])
        if shared:
            gref += w * torch.tensor(g, dtype=torch.float64)
            gmag += abs(w) * torch.tensor(gm, dtype=torch.float64)
        else:
            gref[b] = w * torch.tensor(g, dtype=torch.float64)
            gmag[b] = abs(w) * torch.tensor(gm, dtype=torch.float64)
    if grad is not None:
        grad = grad.double().cpu()
        assert torch.isfinite(grad).all(), grad
        err = (grad - gref).abs()
        assert (err <= 4 * TOL[dtype] * gmag).all(), (grad, gref)


DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("fractional", [False, True])
def test_dense_shared(device, dtype, mixed, fractional):
    gen = torch.Generator().manual_seed(1000 + 7 * mixed + 3 * fractional + (dtype == torch.float64))
    for V, B in [(3, 2), (7, 5), (40, 3)]:
        la = draw_log_alpha((V,), dtype, gen, mixed)
        counts = draw_counts((B, V), gen, fractional)
        w = torch.rand(B, generator=gen, dtype=torch.float64) + 0.5
        la_d = la.to(device).requires_grad_()
        out = dm.log_lik(counts.to(device=device, dtype=dtype), la_d)
        (g,) = torch.autograd.grad((out * w.to(device=device, dtype=dtype)).sum(), la_d)
        check_rows(out.detach().cpu(), g, counts, la, dtype, w)
        # The sum of the rows (the single-pass gradient where it applies).
        la_d = la.to(device).requires_grad_()
        out = dm.log_lik(counts.to(device=device, dtype=dtype), la_d)
        (g,) = torch.autograd.grad(out.sum(), la_d)
        check_rows(out.detach().cpu(), g, counts, la, dtype, torch.ones(B))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mixed", [False, True])
def test_dense_per_sample(device, dtype, mixed):
    gen = torch.Generator().manual_seed(2000 + 7 * mixed + (dtype == torch.float64))
    for V, B in [(3, 4), (20, 3)]:
        la = draw_log_alpha((B, V), dtype, gen, mixed)
        counts = draw_counts((B, V), gen)
        w = torch.rand(B, generator=gen, dtype=torch.float64) + 0.5
        la_d = la.to(device).requires_grad_()
        out = dm.log_lik(counts.to(device=device, dtype=dtype), la_d)
        (g,) = torch.autograd.grad((out * w.to(device=device, dtype=dtype)).sum(), la_d)
        check_rows(out.detach().cpu(), g, counts, la, dtype, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_components(device, dtype):
    gen = torch.Generator().manual_seed(3000 + (dtype == torch.float64))
    K, V, B = 3, 6, 4
    la = torch.stack([draw_log_alpha((V,), dtype, gen, mixed=k == 2) for k in range(K)])
    counts = draw_counts((B, V), gen)
    w = torch.rand(B, K, generator=gen, dtype=torch.float64) + 0.5
    la_d = la.to(device).requires_grad_()
    out = dm.log_lik_components(counts.to(device=device, dtype=dtype), la_d)
    (g,) = torch.autograd.grad((out * w.to(device=device, dtype=dtype)).sum(), la_d)
    out, g = out.detach().cpu(), g.cpu()
    for k in range(K):
        check_rows(out[:, k], g[k], counts, la[k], dtype, w[:, k])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mixed", [False, True])
def test_sparse_csr(device, dtype, mixed):
    gen = torch.Generator().manual_seed(4000 + 7 * mixed + (dtype == torch.float64))
    V, B = 9, 5
    la = draw_log_alpha((V,), dtype, gen, mixed)
    counts = draw_counts((B, V), gen)
    w = torch.rand(B, generator=gen, dtype=torch.float64) + 0.5
    sparse = counts.to(device=device, dtype=dtype).to_sparse_csr()
    la_d = la.to(device).requires_grad_()
    out = dm.log_lik(sparse, la_d)
    (g,) = torch.autograd.grad((out * w.to(device=device, dtype=dtype)).sum(), la_d)
    check_rows(out.detach().cpu(), g, counts, la, dtype, w)
    la_d = la.to(device).requires_grad_()
    out = dm.log_lik(sparse, la_d)
    (g,) = torch.autograd.grad(out.sum(), la_d)
    check_rows(out.detach().cpu(), g, counts, la, dtype, torch.ones(B))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_components(device, dtype):
    gen = torch.Generator().manual_seed(4500 + (dtype == torch.float64))
    K, V, B = 2, 7, 4
    la = torch.stack([draw_log_alpha((V,), dtype, gen, mixed=k == 1) for k in range(K)])
    counts = draw_counts((B, V), gen)
    sparse = counts.to(device=device, dtype=dtype).to_sparse_csr()
    out = dm.log_lik_components(sparse, la.to(device)).cpu()
    for k in range(K):
        check_rows(out[:, k], None, counts, la[k], dtype, torch.ones(B))


def test_issue_examples(device):
    out = dm.log_lik(torch.tensor([[5., 0, 0]], device=device),
                     torch.full((3,), -120., device=device), validate=True)
    assert abs(float(out) + math.log(3)) < 1e-5
    out = dm.log_lik(torch.tensor([[3., 1, 0, 2]], device=device),
                     torch.full((4,), 100., device=device))
    v, _, mag, _ = mp_row([3, 1, 0, 2], [100.0] * 4)
    assert abs(float(out) - v) <= 4e-6 * mag
    d = dm.DirichletMultinomial(9, log_concentration=torch.full((3,), -120., device=device))
    lp = d.log_prob(torch.tensor([9., 0, 0], device=device))
    # The normalized pmf: all mass on the one category with a = A / 3.
    assert abs(float(lp) + math.log(3)) < 1e-5


@pytest.mark.parametrize("count_dtype", [torch.int64, torch.int32])
def test_large_integer_count_float32(device, count_dtype):
    gen = torch.Generator().manual_seed(5000)
    la = (torch.rand(3, generator=gen) * 2 - 1)
    counts = torch.tensor([[2 ** 24 + 1, 3, 0], [2 ** 24 + 7, 0, 5]], dtype=count_dtype)
    w = torch.rand(2, generator=gen, dtype=torch.float64) + 0.5
    la_d = la.to(device).requires_grad_()
    out = dm.log_lik(counts.to(device), la_d)
    (g,) = torch.autograd.grad((out * w.to(device=device, dtype=torch.float32)).sum(), la_d)
    check_rows(out.detach().cpu(), g, counts.double(), la, torch.float32, w)
    # Per-sample concentrations.
    la2 = la.expand(2, 3).clone()
    la_d = la2.to(device).requires_grad_()
    out = dm.log_lik(counts.to(device), la_d)
    (g,) = torch.autograd.grad((out * w.to(device=device, dtype=torch.float32)).sum(), la_d)
    check_rows(out.detach().cpu(), g, counts.double(), la2, torch.float32, w)


# Shapes that take the kernels' other ways (on CUDA the small problems above
# are one launch each): the tables, the fill ring, rows in chunks, components
# by table and by rows, per-sample rows in chunks, CSR. The reference is the
# CPU in float64 (itself checked against mpmath above).
SCALE_SHAPES = [
    ("shared", 1, 300, 3000), ("shared", 1, 4, 60000), ("shared", 1, 2000, 40),
    ("per_sample", 1, 40, 3000), ("per_sample", 1, 6, 20000),
    ("components", 3, 120, 700), ("components", 4, 30, 5000),
    ("csr", 1, 200, 3000), ("csr", 3, 200, 3000),
]


def _magnitudes(counts, la, shared):
    """Bounds on a row's terms and on a gradient entry's terms (float64)."""
    la_rows = la.expand(counts.shape[0], -1, -1) if shared else la.unsqueeze(1)
    n = counts.unsqueeze(1)
    N = counts.sum(-1, keepdim=True).unsqueeze(1)
    log_A = torch.logsumexp(la_rows, -1, keepdim=True)
    mag = ((n * (la_rows.abs() + torch.log1p(n))).sum(-1)
           + (N * (log_A.abs() + torch.log1p(N))).squeeze(-1))
    gmag = n + N + 1
    return mag, gmag


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,K,B,V", SCALE_SHAPES)
def test_at_scale_matches_float64(device, dtype, kind, K, B, V):
    gen = torch.Generator().manual_seed(6000 + B + V + K + (dtype == torch.float64))
    shape = (B, V) if kind == "per_sample" else (K, V)
    la = draw_log_alpha(shape, dtype, gen, mixed=True)
    counts = draw_counts((B, V), gen)
    counts = counts * (torch.rand((B, V), generator=gen) < 0.2)  # mostly zeros
    counts[:, 0] += 1
    counts[0, 1] = 300  # off the tables
    w = torch.rand(B, K, generator=gen, dtype=torch.float64) + 0.5
    la_k = la[0] if kind in ("shared", "csr") and K == 1 else la

    def run(device, dt):
        x = counts.to(device=device, dtype=dt)
        if kind == "csr":
            x = x.to_sparse_csr()
        la_d = la_k.to(device=device, dtype=dt).requires_grad_()
        per_component = kind == "components" or (kind == "csr" and K > 1)
        f = dm.log_lik_components if per_component else dm.log_lik
        out = f(x, la_d)
        wt = w.to(device=device, dtype=dt)
        wt = wt if out.dim() == 2 else wt[:, 0]
        (g,) = torch.autograd.grad((out * wt).sum(), la_d)
        return out.detach().double().cpu(), g.double().cpu()

    out, g = run(device, dtype)
    ref, gref = run("cpu", torch.float64)
    mag, gmag = _magnitudes(counts, la.double() if la.dim() == 2 else la.double().unsqueeze(0),
                            shared=kind != "per_sample")
    mag = mag if out.dim() == 2 else mag[:, 0]
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    assert torch.isfinite(out).all() and torch.isfinite(g).all()
    assert ((out - ref).abs() <= tol * mag).all(), ((out - ref).abs() / mag).max()
    # A gradient entry sums over rows: its bound, weighted like the rows.
    wm = w.abs() if kind != "per_sample" else w.abs()[:, 0:1]
    if kind == "per_sample":
        gbound = wm * gmag[:, 0]
    else:
        gbound = torch.einsum("bk,bkv->kv", wm, gmag.expand(-1, K, -1))
        gbound = gbound if la_k.dim() == 2 else gbound[0]
    assert ((g - gref).abs() <= tol * gbound).all(), ((g - gref).abs() / gbound).max()
