"""Higher-precision references for the tests."""
import mpmath
import torch


def log_lik_float64(counts, log_alpha, normalize=False):
    """The lgamma formula in float64 (accurate where float32 is not, except
    for very large concentrations, where mpmath is used instead)."""
    counts = counts.double().cpu()
    alpha = log_alpha.double().cpu().exp()
    if alpha.dim() == 1:
        alpha = alpha.expand_as(counts)
    A, N = alpha.sum(-1), counts.sum(-1)
    out = (torch.lgamma(A) - torch.lgamma(N + A)
           + (torch.lgamma(counts + alpha) - torch.lgamma(alpha)).sum(-1))
    if normalize:
        out = out + torch.lgamma(N + 1) - torch.lgamma(counts + 1).sum(-1)
    return out


def components_float64(counts, log_alpha, normalize=False):
    return torch.stack([log_lik_float64(counts, la, normalize) for la in log_alpha], dim=-1)


mpmath.mp.dps = 50


def _mpf(x):
    return x if isinstance(x, mpmath.mpf) else mpmath.mpf(float(x))


def mp_lnpoch(a, n):
    a, n = _mpf(a), _mpf(n)
    return mpmath.loggamma(a + n) - mpmath.loggamma(a)


def mp_adpoch(a, n):
    a, n = _mpf(a), _mpf(n)
    return a * (mpmath.digamma(a + n) - mpmath.digamma(a))
