"""Shared test helpers: higher-precision references (the float64 lgamma
formula with autograd, mpmath), random inputs and the tolerances that go with
them. Test modules import from here, never from each other.

The float64 reference is dirmult_ext.reference_log_lik, the plain
torch.lgamma formula a user writes, evaluated in float64 on the CPU: it calls
none of the dirmult ops, so it stays independent of the kernels under test
(test_log_lik.py checks it against mpmath)."""
import mpmath
import torch

from dirmult_ext import reference_log_lik

COUNT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                torch.int32, torch.int64, torch.uint8]


def tolerance(dtype):
    """Forward values relative to the row's magnitudes (see magnitudes):
    float64 compute, or float32 compute for every other count dtype."""
    return 1e-12 if dtype == torch.float64 else 2e-6


# ------------------------------------------------------------ random inputs
def random_counts(shape, dtype, device, high=10, zero_frac=0.5):
    """Integers in [0, high), about zero_frac of them zero, never all zero."""
    counts = torch.randint(0, high, shape)
    counts = counts * (torch.rand(shape) > zero_frac)
    if counts.numel() and counts.sum() == 0:
        counts.view(-1)[0] = 1
    return counts.to(dtype=dtype, device=device)


def mixed_counts(B, V, device, dtype=torch.float32):
    """Mostly zeros and small integers (the tables' 0..16), with some counts
    off the table (large; non-integer for float dtypes; uint8 clamped)."""
    counts = torch.randint(0, 17, (B, V)).double()
    counts *= torch.rand(B, V) > 0.6
    big = torch.rand(B, V) < 0.02
    counts[big] = torch.randint(17, 300, (int(big.sum()),)).double()
    if dtype.is_floating_point:
        frac = torch.rand(B, V) < 0.02
        counts[frac] = torch.rand(int(frac.sum())).double() * 30
    else:
        counts.clamp_(max=255)
    return counts.to(dtype=dtype, device=device)


def cancelling_rows(B, V, with_large_terms):
    """Per-sample rows whose terms mostly cancel: counts 2 and 3 at a in
    (0.3, 1), nearly every lnpoch in (-1, 1). with_large_terms: a third of
    the columns large terms instead (counts 9..16 at log_alpha in (1, 3)),
    whose magnitudes absorb the float32 error of the cancelling ones (the
    float32 paths keep those values); without, nothing does (the float32
    paths redo them in float64)."""
    counts = torch.randint(2, 4, (B, V)).float()
    la = torch.empty(B, V).uniform_(-1.2, 0.0)
    if with_large_terms:
        counts[:, ::3] = torch.randint(9, 17, counts[:, ::3].shape).float()
        la[:, ::3] = torch.empty(la[:, ::3].shape).uniform_(1.0, 3.0)
    return counts, la


def grad_tolerances(device):
    """(float32, float64) tolerances of a gradient against the float64
    formula, relative to the largest |gradient| (per component for
    log_lik_components). CPU: 3-4x the error seen over 20 draws (float32
    3.2e-7, float64 5.4e-14). CUDA keeps the bounds its float64 kernels were
    checked to before (1e-5; 1e-10), until gpu_check.sh measures them."""
    if torch.device(device).type == "cpu":
        return 1e-6, 2e-13
    return 1e-5, 1e-10


# ------------------------------------------------------- float64 references
def log_lik_float64(counts, log_alpha, normalize=False):
    """The lgamma formula in float64 on the CPU (accurate where float32 is
    not, except for very large concentrations, where mpmath is used
    instead). Differentiable: autograd of it is the reference gradient."""
    return reference_log_lik(counts.double().cpu(), log_alpha.double().cpu(), normalize)


def components_float64(counts, log_alpha, normalize=False):
    return torch.stack([log_lik_float64(counts, la, normalize) for la in log_alpha], dim=-1)


def grad_float64(counts, log_alpha, weights=None, normalize=False):
    """d sum(weights * log_lik) / d log_alpha by autograd of the float64
    formula; weights default to ones (the gradient of the rows' sum)."""
    la = log_alpha.detach().double().cpu().requires_grad_()
    out = log_lik_float64(counts, la, normalize)
    w = torch.ones_like(out) if weights is None else weights.detach().double().cpu()
    g, = torch.autograd.grad((out * w).sum(), la)
    return g


def components_grad_float64(counts, log_alpha, weights, normalize=False):
    """d sum(weights * log_lik_components) / d log_alpha (K, V), by autograd
    of the float64 formula."""
    la = log_alpha.detach().double().cpu().requires_grad_()
    out = components_float64(counts, la, normalize)
    g, = torch.autograd.grad((out * weights.detach().double().cpu()).sum(), la)
    return g


def magnitudes(counts, log_alpha, normalize=False):
    """Float32 results are accurate relative to the size of the terms they
    sum, not of the sum (large counts make large, cancelling terms; with V = 1
    the terms cancel exactly): per row, sum_v |lnpoch(a_v, n_v)| + |lnpoch(A,
    N)| [+ log N! + sum_v log n_v! when normalized]; per column (shared log_alpha), sum_b |a_v dpoch(a_v, n_bv)| + a_v
    sum_b |dpoch(A, N_b)|."""
    V = counts.shape[-1]
    n = counts.detach().double().cpu().reshape(-1, V)
    a = log_alpha.detach().double().cpu().exp().reshape(-1, V)
    A, N = a.sum(-1), n.sum(-1)
    rows = ((torch.lgamma(n + a) - torch.lgamma(a)).abs().sum(-1)
            + (torch.lgamma(N + A) - torch.lgamma(A)).abs())
    if normalize:
        rows = rows + torch.lgamma(N + 1) + torch.lgamma(n + 1).sum(-1)
    cols = ((a * (torch.digamma(n + a) - torch.digamma(a))).abs().sum(0)
            + (a * (torch.digamma(N + A) - torch.digamma(A)).abs().unsqueeze(-1)).sum(0))
    return rows.reshape(counts.shape[:-1]), cols


def component_magnitudes(counts, log_alpha, normalize=False):
    """magnitudes' row sizes for each component: (B, K)."""
    return torch.stack([magnitudes(counts, la, normalize)[0] for la in log_alpha], dim=-1)


def per_sample_grad_error(grad, counts, log_alpha, weights):
    """The largest error of the gradient of sum_b w_b out_b with respect to
    per-sample log_alpha (B, V), each element relative to its own terms:
    |w_b| (|a dpoch(a, n)| + |a dpoch(A, N)|)."""
    n, a = counts.double().cpu(), log_alpha.detach().double().cpu().exp()
    w = weights.double().cpu()[:, None]
    A, N = a.sum(-1, keepdim=True), n.sum(-1, keepdim=True)
    adp = a * (torch.digamma(n + a) - torch.digamma(a))
    adA = a * (torch.digamma(N + A) - torch.digamma(A))
    ref = w * (adp - adA)
    scale = w.abs() * (adp.abs() + adA.abs())
    return ((grad.double().cpu() - ref).abs() / scale.clamp_min(1e-30)).max().item()


def rel_error(x, ref, scale):
    """Largest |x - ref| relative to scale (elementwise, at least 1)."""
    return ((x.detach().double().cpu() - ref).abs() / scale.clamp_min(1.0)).max().item()


# ------------------------------------------------------------------- mpmath
mpmath.mp.dps = 50


def _mpf(x):
    return x if isinstance(x, mpmath.mpf) else mpmath.mpf(float(x))


def mp_lnpoch(a, n):
    a, n = _mpf(a), _mpf(n)
    return mpmath.loggamma(a + n) - mpmath.loggamma(a)


def mp_adpoch(a, n):
    a, n = _mpf(a), _mpf(n)
    return a * (mpmath.digamma(a + n) - mpmath.digamma(a))


def random_sparse_counts(B, V, density, dtype=torch.float32, max_count=12, generator=None):
    """Dense (B, V) counts with about `density` of them nonzero, each 1..max_count,
    and a tenth of those non-integer or above the exact path (up to 300).
    Never all zero when B, V and density are positive (entry (0, 0) is set)."""
    mask = torch.rand(B, V, generator=generator) < density
    counts = torch.randint(1, max_count + 1, (B, V), generator=generator).double()
    odd = torch.rand(B, V, generator=generator) < 0.1
    far = torch.randint(17, 301, (B, V), generator=generator).double()
    frac = torch.rand(B, V, generator=generator).double() * 40.0 + 0.25
    counts = torch.where(odd, torch.where(torch.rand(B, V, generator=generator) < 0.5, far, frac),
                         counts)
    counts = counts * mask
    if B > 0 and V > 0 and density > 0:
        counts[0, 0] = 3.0
    if not dtype.is_floating_point:
        counts = counts.round()
    return counts.to(dtype)


def separated_mixture(B=900, V=12, K=3, seed=None):
    """K components, each putting alpha 4 on its own block of 4 categories
    and 0.4 elsewhere; labels uniform; totals 40..99."""
    if seed is not None:
        torch.manual_seed(seed)
    alpha = torch.full((K, V), 0.4, dtype=torch.float64)
    for k in range(K):
        alpha[k, 4 * k:4 * k + 4] = 4.0
    z = torch.randint(0, K, (B,))
    from dirmult_ext.likelihood.distribution import DirichletMultinomial
    x = DirichletMultinomial(torch.randint(40, 100, (B,)), alpha[z]).sample().float()
    return x, z, alpha


def regression_counts(B, W, b, *, x_mean=0.0, generator=None, n_lo=20, n_hi=120):
    """Covariates N(x_mean, 1); counts DM(N_b, exp(X W + b)), N_b uniform in
    [n_lo, n_hi). Rows are never all zero."""
    P, V = W.shape
    X = torch.randn(B, P, dtype=torch.float64, generator=generator) + x_mean
    N = torch.randint(n_lo, n_hi, (B,), generator=generator)
    if generator is not None:
        state = torch.get_rng_state()
        torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=generator)))
    from dirmult_ext import DirichletMultinomial
    counts = DirichletMultinomial(N, (X @ W + b).exp()).sample()
    if generator is not None:
        torch.set_rng_state(state)
    return counts.to(torch.float32), X
