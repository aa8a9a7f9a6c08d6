"""Second derivatives of log_lik and log_lik_components with respect to the
concentrations: autograd formulas for the backward ops
``dirmult::log_lik_backward`` and ``dirmult::log_lik_components_backward``,
and the fake kernels of ``dirmult::tpoch_terms`` (their elementwise
second-derivative terms) and ``dirmult::poch_terms`` (the first-derivative terms). Importing the module registers them.

With ``a = exp(log_alpha)``, ``A = sum_v a_v``, ``N = sum_v n_v``, a row's
gradient is ``G_v = adpoch(a_v, n_v) - (a_v / A) adpoch(A, N)``, and its
derivative with respect to ``log_alpha_u`` is

    d G_v / d log a_u = delta_uv [dadpoch(a_v, n_v) - (a_v / A) adpoch(A, N)]
                        - (a_u a_v / A^2) a2tpoch(A, N)

(``a2tpoch(a, n) = a^2 (psi1(a+n) - psi1(a))``, ``dadpoch = d adpoch / d log
a``, both from ``dirmult::tpoch_terms``; See Note [Trigamma terms]). For a
vector ``w`` contracted with the gradient (the double backward's incoming
gradient), with ``c = sum_v a_v w_v / A``, the row contributes

    w_u dadpoch(a_u, n_u) - (a_u / A) [w_u dadpoch(A, N) + (c - w_u) a2tpoch(A, N)]

(``adpoch(A, N) = dadpoch(A, N) - a2tpoch(A, N)`` substituted: only the two
terms of tpoch_terms enter). The derivative with respect to the incoming
gradient of the backward is the per-sample gradient contracted with ``w``.
These formulas are torch ops around the elementwise op and keep O(B V)
elements (per chunk of components for log_lik_components); a third
derivative is not supported (tpoch_terms raises when differentiated).

Second derivatives with respect to counts are not supported: the double
backward raises when counts require grad.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from .library import ops

# Elements of one chunk of the components' (B, K, V) double-backward terms.
_COMPONENT_CHUNK_ELEMENTS = 1 << 24


def _counts_error(op: str) -> NotImplementedError:
    return NotImplementedError(
        f"dirmult: second derivatives of {op} with respect to counts are not supported "
        "(nor mixed counts/log_alpha ones); only log_alpha can be differentiated twice. "
        "Pass counts without requires_grad (counts.detach()) to differentiate twice with "
        "respect to log_alpha.")


# ---------------------------------------------------------------- tpoch_terms
@torch.library.register_fake("dirmult::tpoch_terms")
def _tpoch_terms_fake(log_alpha, n):
    return torch.empty_like(log_alpha), torch.empty_like(log_alpha)


def _tpoch_terms_backward(ctx, grad_a2t, grad_dad):
    raise NotImplementedError(
        "dirmult: third derivatives of log_lik are not supported (tpoch_terms, the "
        "elementwise second-derivative terms, has no derivative)")


torch.library.register_autograd("dirmult::tpoch_terms", _tpoch_terms_backward,
                                setup_context=lambda ctx, inputs, output: None)


def _row_terms(log_alpha, n_rows):
    """a, A = sum a and the rows' (a2tpoch(A, N), dadpoch(A, N)), N the rows'
    totals n_rows (..., 1); log_alpha (..., V)."""
    log_A = torch.logsumexp(log_alpha, -1, keepdim=True)
    log_A_rows, N = torch.broadcast_tensors(log_A, n_rows)
    a2t_row, dad_row = ops.tpoch_terms(log_A_rows.contiguous(), N.contiguous())
    return log_alpha.exp(), log_A.exp(), a2t_row, dad_row


def _masked(g, terms):
    # Rows whose incoming gradient is 0 do not enter the gradient, as in the
    # first-order kernels (their bad counts do not make it NaN).
    return torch.where(g != 0, g * terms, torch.zeros((), dtype=terms.dtype,
                                                      device=terms.device))


# ------------------------------------------------------------ log_lik_backward
def _log_lik_backward_setup(ctx, inputs, output):
    grad, counts, log_alpha, normalize, counts_grad = inputs
    ctx.save_for_backward(grad, counts, log_alpha)
    ctx.normalize = normalize
    ctx.counts_grad = counts_grad
    # An unused output's gradient arrives as None: the counts gradient's
    # tells whether a mixed second derivative is asked for.
    ctx.set_materialize_grads(False)


def _log_lik_double_backward(ctx, w, grad_counts_grad):
    grad, counts, log_alpha = ctx.saved_tensors
    if ctx.needs_input_grad[1] or (ctx.counts_grad and grad_counts_grad is not None):
        raise _counts_error("log_lik")
    need_grad, need_la = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
    if w is None or not (need_grad or need_la):
        return None, None, None, None, None
    x = counts.to(log_alpha.dtype)
    # (A single row, counts (V,), takes the per-sample formula: the same.)
    shared = log_alpha.dim() == 1 and x.dim() != 1
    per_sample_la = log_alpha.expand(x.shape)
    d_grad = d_la = None
    if need_la:
        g = grad.reshape(x.shape[:-1]).unsqueeze(-1)
        a, A, a2t_row, dad_row = _row_terms(log_alpha, x.sum(-1, keepdim=True))
        _, dad = ops.tpoch_terms(per_sample_la.contiguous(), x.contiguous())
        c = (a * w).sum(-1, keepdim=True) / A
        if shared:
            lead = tuple(range(x.dim() - 1))
            s1 = _masked(g, dad).sum(lead)
            r1 = _masked(g, dad_row).sum()
            r2 = _masked(g, a2t_row).sum()
            d_la = w * s1 - (a / A) * (w * r1 + (c - w) * r2)
        else:
            d_la = _masked(g, w * dad - (a / A) * (w * dad_row + (c - w) * a2t_row))
    if need_grad:
        per_sample, _ = ops.log_lik_backward(
            torch.ones(x.shape[:-1], dtype=log_alpha.dtype, device=log_alpha.device),
            counts, per_sample_la.contiguous(), ctx.normalize, False)
        d_grad = (per_sample * w).sum(-1).reshape(grad.shape)
    return d_grad, None, d_la, None, None


torch.library.register_autograd("dirmult::log_lik_backward", _log_lik_double_backward,
                                setup_context=_log_lik_backward_setup)


# ------------------------------------------------- log_lik_components_backward
def _components_backward_setup(ctx, inputs, output):
    grad, counts, log_alpha = inputs
    ctx.save_for_backward(grad, counts, log_alpha)


def _component_chunks(B, K, V):
    step = max(1, min(K, _COMPONENT_CHUNK_ELEMENTS // max(1, B * V)))
    return [(k, min(K, k + step)) for k in range(0, K, step)]


def _components_double_backward(ctx, w):
    grad, counts, log_alpha = ctx.saved_tensors
    if ctx.needs_input_grad[1]:
        raise _counts_error("log_lik_components")
    need_grad, need_la = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
    x = counts.to(log_alpha.dtype)
    (B, V), K = x.shape, log_alpha.shape[0]
    if w is None or not (need_grad or need_la):
        return None, None, None
    if K == 0:
        return (torch.zeros_like(grad) if need_grad else None, None,
                torch.zeros_like(log_alpha) if need_la else None)
    chunks = _component_chunks(B, K, V)
    d_grad = d_la = None
    if need_la:
        a, A, a2t_row, dad_row = _row_terms(log_alpha.unsqueeze(0),
                                            x.sum(-1, keepdim=True).unsqueeze(-1))
        a, A = a[0], A[0]  # (K, V), (K, 1); row terms (B, K, 1)
        s1 = torch.cat([
            _masked(grad[:, k0:k1, None], ops.tpoch_terms(
                log_alpha[None, k0:k1].expand(B, k1 - k0, V).contiguous(),
                x[:, None].expand(B, k1 - k0, V).contiguous())[1]).sum(0)
            for k0, k1 in chunks])
        g = grad.unsqueeze(-1)
        r1 = _masked(g, dad_row).sum(0)  # (K, 1)
        r2 = _masked(g, a2t_row).sum(0)
        c = (a * w).sum(-1, keepdim=True) / A
        d_la = w * s1 - (a / A) * (w * r1 + (c - w) * r2)
    if need_grad:
        parts = []
        for k0, k1 in chunks:
            shape = (B, k1 - k0, V)
            per_sample, _ = ops.log_lik_backward(
                torch.ones(shape[:-1], dtype=log_alpha.dtype, device=log_alpha.device),
                counts[:, None].expand(shape).contiguous(),
                log_alpha[None, k0:k1].expand(shape).contiguous(), False, False)
            parts.append((per_sample * w[k0:k1]).sum(-1))
        d_grad = torch.cat(parts, dim=1)
    return d_grad, None, d_la


torch.library.register_autograd("dirmult::log_lik_components_backward",
                                _components_double_backward,
                                setup_context=_components_backward_setup)


@torch.library.register_fake("dirmult::poch_terms")
def _poch_terms_fake(log_alpha, n):
    return torch.empty_like(log_alpha), torch.empty_like(log_alpha)


# ------------------------------------------------ the formulas, as functions
# For .transforms, whose autograd.Functions under the torch.func transforms
# call the same formulas outside a registered op's autograd context.
def counts_error(op: str) -> NotImplementedError:
    """The error of a second derivative with respect to counts."""
    return _counts_error(op)


def log_lik_double_backward(w, grad, counts, log_alpha, normalize, need_grad, need_la):
    """(d_grad, d_log_alpha) of log_lik_backward's formula above for the
    incoming gradient w of grad_log_alpha (None where not needed)."""
    ctx = SimpleNamespace(saved_tensors=(grad, counts, log_alpha), normalize=normalize,
                          counts_grad=False,
                          needs_input_grad=(need_grad, False, need_la, False, False))
    d_grad, _, d_la, _, _ = _log_lik_double_backward(ctx, w, None)
    return d_grad, d_la


def components_double_backward(w, grad, counts, log_alpha, need_grad, need_la):
    """(d_grad, d_log_alpha) of log_lik_components_backward's formula above."""
    ctx = SimpleNamespace(saved_tensors=(grad, counts, log_alpha),
                          needs_input_grad=(need_grad, False, need_la))
    d_grad, _, d_la = _components_double_backward(ctx, w)
    return d_grad, d_la
