"""The ops under the ``torch.func`` transforms and forward-mode AD: batching
rules for ``torch.vmap`` and autograd.Functions that ``torch.func.grad``,
``jacrev``, ``jacfwd``, ``jvp``, ``hessian``, ``torch.autograd.forward_ad``
and their compositions with ``vmap`` accept. See Note [torch.func].

Note [torch.func]
~~~~~~~~~~~~~~~~~
``register_autograd`` wraps an op's formula in an autograd.Function without
a ``setup_context`` staticmethod, which the functorch transforms refuse
(torch raises "it must override the setup_context staticmethod"), and it
has no forward mode (a dual tensor's tangent would be dropped). So while a
transform or a ``forward_ad.dual_level`` is active, the public functions
call the ops through the functions below instead: each has
``setup_context``, a ``jvp`` (forward mode) and ``generate_vmap_rule``
(torch vmaps forward, backward and jvp, reaching the ops' batching rules
registered here). Every derivative is again such a function or plain torch
ops, so derivatives of derivatives compose as deep as formulas exist, in
either mode, in any order (``jacfwd(jacfwd)``, ``jacfwd(jacrev)`` =
``hessian``, ``jacrev(jacfwd)``, ``jacrev(jacrev)``, ``jvp(jvp)``,
``jvp(grad)``, ``vmap`` of any of them):

* log_lik, log_lik_components: first and second derivatives with respect to
  log_alpha; for log_lik also first derivatives with respect to floating
  counts. Third derivatives, and second ones involving counts, raise
  NotImplementedError, as in plain autograd.
* log_lik_regression: the forward is the fused op; its derivatives are
  formed from the (B, V) concentrations ``X @ W + bias`` through log_lik's
  functions, so they compose to every order log_lik's do.
* sparse counts (the CSR ops; a SparseCounts, or a torch sparse CSR, CSC or
  COO tensor closed over by the function, converted before the op): first
  and second derivatives with respect to log_alpha, from the nonzeros'
  formulas (a third raises). ``vmap`` over log_alpha works; ``vmap`` over
  a batch of sparse tensors raises (rows of different lengths): pass the
  rows dense.

Note [Forward over forward]
~~~~~~~~~~~~~~~~~~~~~~~~~~~
torch calls an autograd.Function's ``jvp`` staticmethod with forward-mode
AD turned off, at every level: an enclosing ``jacfwd``/``jvp`` then sees a
tangent that does not depend on the point and returns zeros for the second
derivative, silently. Each ``jvp`` below therefore turns forward mode back
on (dispatch.forward_ad_in_jvp) and evaluates its formula at the saved
tensors' primals (dispatch.primal: this level's tangent removed, every
enclosing level's kept), through functions that are themselves
differentiable, so the enclosing levels differentiate the tangent itself.

Outside the transforms nothing here runs: eager calls keep the fast path,
torch.compile, export and TorchScript keep the registered ops.
"""
from __future__ import annotations

import torch

from . import second_derivatives
from .csr import row_of_nonzero
from .dispatch import forward_ad_in_jvp, primal, register_transformed
from .library import ops

__all__ = ["log_lik", "log_lik_components", "log_lik_regression", "log_lik_csr"]


# ----------------------------------------------------------- batching rules
def _front(x, dim, n):
    """x with its batch dimension first, or expanded to n where it has none."""
    if dim is None:
        return x.expand((n,) + tuple(x.shape))
    return x.movedim(dim, 0)


def _each(op, info, in_dims, *args):
    """The op per batch element, stacked: for the combinations no rule
    below batches in one call (ragged CSR parts, batched regression
    coefficients together with batched rows)."""
    results = []
    for i in range(info.batch_size):
        results.append(op(*[a.select(d, i) if d is not None and isinstance(a, torch.Tensor)
                            else a for a, d in zip(args, in_dims)]))
    if isinstance(results[0], tuple):
        out = tuple(torch.stack(parts) for parts in zip(*results))
        return out, (0,) * len(out)
    return torch.stack(results), 0


def _logical_dim(x, dim):
    return x.dim() - (dim is not None)


def _log_lik_vmap(info, in_dims, counts, log_alpha, normalize=False):
    n = info.batch_size
    cd, ld = in_dims[0], in_dims[1]
    c_dim, l_dim = _logical_dim(counts, cd), _logical_dim(log_alpha, ld)
    shared = l_dim == 1 and c_dim > 1
    if cd is None and l_dim == 1:
        # A batch of concentration vectors against fixed rows: components.
        rows = counts.reshape(-1, counts.shape[-1])
        out = ops.log_lik_components(rows, log_alpha.movedim(ld, 0).contiguous(), normalize)
        return out.movedim(1, 0).reshape((n,) + tuple(counts.shape[:-1])), 0
    counts = _front(counts, cd, n)
    log_alpha = _front(log_alpha, ld, n)
    if shared and ld is None:
        return ops.log_lik(counts, log_alpha[0], normalize), 0
    if shared:
        log_alpha = log_alpha.reshape((n,) + (1,) * (c_dim - 1) + (log_alpha.shape[-1],))
    return ops.log_lik(counts.contiguous(), log_alpha.expand(counts.shape).contiguous(),
                       normalize), 0


def _log_lik_backward_vmap(info, in_dims, grad, counts, log_alpha, normalize, counts_grad):
    n = info.batch_size
    gd, cd, ld = in_dims[0], in_dims[1], in_dims[2]
    c_dim, l_dim = _logical_dim(counts, cd), _logical_dim(log_alpha, ld)
    shared = l_dim == 1 and c_dim > 1
    V = counts.shape[-1]
    if shared and cd is None and not counts_grad:
        # One gradient per concentration vector: the components' backward.
        rows = counts.reshape(-1, V)
        g = _front(grad, gd, n).reshape(n, rows.shape[0]).t().contiguous()
        la = _front(log_alpha, ld, n).contiguous()
        out = ops.log_lik_components_backward(g, rows, la)
        return (out, log_alpha.new_empty((0,))), (0, None)
    counts = _front(counts, cd, n).contiguous()
    grad = _front(grad, gd, n).expand(counts.shape[:-1]).contiguous()
    log_alpha = _front(log_alpha, ld, n)
    if shared:
        log_alpha = log_alpha.reshape((n,) + (1,) * (c_dim - 1) + (V,))
    grad_la, grad_counts = ops.log_lik_backward(grad, counts, log_alpha.expand(counts.shape)
                                                .contiguous(), normalize, counts_grad)
    if shared:
        grad_la = grad_la.sum(tuple(range(1, c_dim)))
    return (grad_la, grad_counts), (0, 0 if counts_grad else None)


def _components_vmap(info, in_dims, counts, log_alpha, normalize=False):
    n = info.batch_size
    cd, ld = in_dims[0], in_dims[1]
    if ld is None:
        counts = counts.movedim(cd, 0)
        out = ops.log_lik_components(counts.reshape(-1, counts.shape[-1]), log_alpha, normalize)
        return out.reshape(n, counts.shape[1], log_alpha.shape[0]), 0
    if cd is None:
        la = log_alpha.movedim(ld, 0)
        out = ops.log_lik_components(counts, la.reshape(-1, la.shape[-1]).contiguous(),
                                     normalize)
        return out.reshape(counts.shape[0], n, la.shape[1]), 1
    return _each(ops.log_lik_components, info, in_dims, counts, log_alpha, normalize)


def _components_backward_vmap(info, in_dims, grad, counts, log_alpha):
    n = info.batch_size
    gd, cd, ld = in_dims
    if cd is not None:
        return _each(ops.log_lik_components_backward, info, in_dims, grad, counts, log_alpha)
    B, K = counts.shape[0], log_alpha.shape[-2]
    g = _front(grad, gd, n).permute(1, 0, 2).reshape(B, n * K).contiguous()
    la = _front(log_alpha, ld, n).reshape(n * K, -1).contiguous()
    return ops.log_lik_components_backward(g, counts, la).reshape(n, K, -1), 0


def _regression_vmap(info, in_dims, counts, X, W, bias=None, normalize=False):
    n = info.batch_size
    cd, xd, wd = in_dims[0], in_dims[1], in_dims[2]
    bd = in_dims[3] if bias is not None else None
    if wd is not None or bd is not None:
        return _each(ops.log_lik_regression, info, in_dims, counts, X, W, bias, normalize)
    counts, X = _front(counts, cd, n), _front(X, xd, n)
    B = counts.shape[1]
    out = ops.log_lik_regression(counts.reshape(n * B, -1).contiguous(),
                                 X.reshape(n * B, -1).contiguous(), W, bias, normalize)
    return out.reshape(n, B), 0


def _csr_vmap(info, in_dims, crow, col, values, log_alpha, normalize=False):
    n = info.batch_size
    if any(d is not None for d in in_dims[:3]):
        return _each(ops.log_lik_csr, info, in_dims, crow, col, values, log_alpha, normalize)
    la = log_alpha.movedim(in_dims[3], 0)
    out = ops.log_lik_csr(crow, col, values, la.reshape(-1, la.shape[-1]).contiguous(),
                          normalize)
    return out.reshape((out.shape[0], n) + tuple(la.shape[1:-1])), 1


def _csr_backward_vmap(info, in_dims, grad, crow, values, ptr, rows, csc_values, log_alpha):
    n = info.batch_size
    gd, ld = in_dims[0], in_dims[6]
    if any(d is not None for d in in_dims[1:6]):
        return _each(ops.log_lik_csr_backward, info, in_dims, grad, crow, values, ptr, rows,
                     csc_values, log_alpha)
    la = _front(log_alpha, ld, n)
    g = _front(grad, gd, n)  # (n, B) or (n, B, K)
    B, V = g.shape[1], la.shape[-1]
    g = g.movedim(0, 1).reshape(B, -1).contiguous()
    out = ops.log_lik_csr_backward(g, crow, values, ptr, rows, csc_values,
                                   la.reshape(-1, V).contiguous())
    return out.reshape(la.shape), 0


def _elementwise_vmap(op):
    def rule(info, in_dims, log_alpha, counts):
        n = info.batch_size
        la, x = _front(log_alpha, in_dims[0], n), _front(counts, in_dims[1], n)
        first, second = op(la.reshape(n, -1).contiguous(), x.reshape(n, -1).contiguous())
        return (first.reshape(la.shape), second.reshape(la.shape)), (0, 0)
    return rule


for _name, _rule in [("log_lik", _log_lik_vmap),
                     ("log_lik_backward", _log_lik_backward_vmap),
                     ("log_lik_components", _components_vmap),
                     ("log_lik_components_backward", _components_backward_vmap),
                     ("log_lik_regression", _regression_vmap),
                     ("log_lik_csr", _csr_vmap),
                     ("log_lik_csr_backward", _csr_backward_vmap),
                     ("poch_terms", _elementwise_vmap(ops.poch_terms)),
                     ("tpoch_terms", _elementwise_vmap(ops.tpoch_terms))]:
    torch.library.register_vmap("dirmult::" + _name, _rule)


# ------------------------------------------------------- composable functions
def _primals(tensors):
    """The saved tensors without this level's tangent: the point at which
    a jvp's formula is evaluated, differentiable again by enclosing levels
    (Note [Forward over forward])."""
    return tuple(None if t is None else primal(t) for t in tensors)


def _third_order_error():
    return NotImplementedError(
        "dirmult: third derivatives of log_lik are not supported (the second-derivative "
        "formulas have no derivative)")


class _SecondDerivative(torch.autograd.Function):
    """A double backward as one function: its forward runs below every
    transform; it has no derivative of its own."""
    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise _third_order_error()

    @staticmethod
    def jvp(ctx, *tangents):
        raise _third_order_error()


class _LogLikSecond(_SecondDerivative):
    """log_lik's double backward (second_derivatives.log_lik_double_backward)
    as one function of (w, grad, counts, log_alpha)."""

    @staticmethod
    def forward(w, grad, counts, log_alpha, normalize, need_grad, need_la):
        d_grad, d_la = second_derivatives.log_lik_double_backward(
            w, grad, counts, log_alpha, normalize, need_grad, need_la)
        return (d_grad if d_grad is not None else torch.zeros_like(grad),
                d_la if d_la is not None else torch.zeros_like(log_alpha))


class _LogLikBackward(torch.autograd.Function):
    """dirmult::log_lik_backward: (grad_log_alpha, grad_counts)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(grad, counts, log_alpha, normalize, counts_grad):
        return ops.log_lik_backward(grad.contiguous(), counts, log_alpha, normalize, counts_grad)

    @staticmethod
    def setup_context(ctx, inputs, output):
        grad, counts, log_alpha, normalize, counts_grad = inputs
        ctx.save_for_backward(grad, counts, log_alpha)
        ctx.save_for_forward(grad, counts, log_alpha)
        ctx.normalize, ctx.counts_grad = normalize, counts_grad
        # An unused grad_counts arrives as None: a mixed derivative is asked
        # for only where it does not.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, w, w_counts):
        grad, counts, log_alpha = ctx.saved_tensors
        need_grad, need_counts, need_la = ctx.needs_input_grad[:3]
        if need_counts or (ctx.counts_grad and w_counts is not None):
            raise second_derivatives.counts_error("log_lik")
        if w is None or not (need_grad or need_la):
            return None, None, None, None, None
        d_grad, d_la = _LogLikSecond.apply(w, grad, counts, log_alpha, ctx.normalize,
                                           need_grad, need_la)
        return (d_grad if need_grad else None, None, d_la if need_la else None, None, None)

    @staticmethod
    def jvp(ctx, t_grad, t_counts, t_la, _normalize, _counts_grad):
        if t_counts is not None or (ctx.counts_grad and t_la is not None):
            raise second_derivatives.counts_error("log_lik")
        with forward_ad_in_jvp():
            return _LogLikBackward._jvp(ctx, t_grad, t_la)

    @staticmethod
    def _jvp(ctx, t_grad, t_la):
        grad, counts, log_alpha = _primals(ctx.saved_tensors)
        d_la = torch.zeros_like(log_alpha)
        d_counts = (torch.zeros(counts.shape, dtype=log_alpha.dtype, device=log_alpha.device)
                    if ctx.counts_grad else log_alpha.new_zeros((0,)))
        if t_la is not None:
            d_la = d_la + _LogLikSecond.apply(t_la, grad, counts, log_alpha, ctx.normalize,
                                              False, True)[1]
        if t_grad is not None:
            by_grad = _LogLikBackward.apply(t_grad, counts, log_alpha, ctx.normalize,
                                            ctx.counts_grad)
            d_la = d_la + by_grad[0]
            d_counts = d_counts + by_grad[1]
        return d_la, d_counts


class _LogLik(torch.autograd.Function):
    """dirmult::log_lik."""
    generate_vmap_rule = True

    @staticmethod
    def forward(counts, log_alpha, normalize):
        return ops.log_lik(counts, log_alpha, normalize)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)  # (tangents of non-dual inputs arrive as None)
        counts, log_alpha, normalize = inputs
        ctx.save_for_backward(counts, log_alpha)
        ctx.save_for_forward(counts, log_alpha)
        ctx.normalize = normalize

    @staticmethod
    def backward(ctx, grad):
        counts, log_alpha = ctx.saved_tensors
        need_counts, need_la = ctx.needs_input_grad[:2]
        grad_la, grad_counts = _LogLikBackward.apply(grad, counts, log_alpha, ctx.normalize,
                                                     need_counts)
        return (grad_counts.to(counts.dtype) if need_counts else None,
                grad_la if need_la else None, None)

    @staticmethod
    def jvp(ctx, t_counts, t_la, _normalize):
        with forward_ad_in_jvp():
            return _LogLik._jvp(ctx, t_counts, t_la)

    @staticmethod
    def _jvp(ctx, t_counts, t_la):
        # The rows' gradients (per sample) contracted with the tangents.
        counts, log_alpha = _primals(ctx.saved_tensors)
        ones = torch.ones(counts.shape[:-1], dtype=log_alpha.dtype, device=log_alpha.device)
        per_la, per_counts = _LogLikBackward.apply(
            ones, counts, log_alpha.expand(counts.shape).contiguous(), ctx.normalize,
            t_counts is not None)
        out = torch.zeros_like(ones)
        if t_la is not None:
            out = out + (per_la * t_la).sum(-1)
        if t_counts is not None:
            out = out + (per_counts * t_counts.to(per_counts.dtype)).sum(-1)
        return out


class _ComponentsSecond(_SecondDerivative):
    """log_lik_components' double backward as one function."""

    @staticmethod
    def forward(w, grad, counts, log_alpha, need_grad, need_la):
        d_grad, d_la = second_derivatives.components_double_backward(
            w, grad, counts, log_alpha, need_grad, need_la)
        return (d_grad if d_grad is not None else torch.zeros_like(grad),
                d_la if d_la is not None else torch.zeros_like(log_alpha))


class _ComponentsBackward(torch.autograd.Function):
    """dirmult::log_lik_components_backward."""
    generate_vmap_rule = True

    @staticmethod
    def forward(grad, counts, log_alpha):
        return ops.log_lik_components_backward(grad.contiguous(), counts, log_alpha)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, w):
        grad, counts, log_alpha = ctx.saved_tensors
        need_grad, need_counts, need_la = ctx.needs_input_grad
        if need_counts:
            raise second_derivatives.counts_error("log_lik_components")
        d_grad, d_la = _ComponentsSecond.apply(w, grad, counts, log_alpha, need_grad, need_la)
        return d_grad if need_grad else None, None, d_la if need_la else None

    @staticmethod
    def jvp(ctx, t_grad, t_counts, t_la):
        if t_counts is not None:
            raise second_derivatives.counts_error("log_lik_components")
        with forward_ad_in_jvp():
            return _ComponentsBackward._jvp(ctx, t_grad, t_la)

    @staticmethod
    def _jvp(ctx, t_grad, t_la):
        grad, counts, log_alpha = _primals(ctx.saved_tensors)
        out = torch.zeros_like(log_alpha)
        if t_la is not None:
            out = out + _ComponentsSecond.apply(t_la, grad, counts, log_alpha, False, True)[1]
        if t_grad is not None:
            out = out + _ComponentsBackward.apply(t_grad, counts, log_alpha)
        return out


class _Components(torch.autograd.Function):
    """dirmult::log_lik_components."""
    generate_vmap_rule = True

    @staticmethod
    def forward(counts, log_alpha, normalize):
        return ops.log_lik_components(counts, log_alpha, normalize)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)  # (tangents of non-dual inputs arrive as None)
        counts, log_alpha, normalize = inputs
        ctx.save_for_backward(counts, log_alpha)
        ctx.save_for_forward(counts, log_alpha)

    @staticmethod
    def backward(ctx, grad):
        counts, log_alpha = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            raise NotImplementedError(
                "dirmult: log_lik_components has no gradient with respect to counts")
        return None, _ComponentsBackward.apply(grad, counts, log_alpha), None

    @staticmethod
    def jvp(ctx, t_counts, t_la, _normalize):
        if t_counts is not None:
            raise NotImplementedError(
                "dirmult: log_lik_components has no derivative with respect to counts")
        with forward_ad_in_jvp():
            return _Components._jvp(ctx, t_la)

    @staticmethod
    def _jvp(ctx, t_la):
        # Each (row, component)'s gradient contracted with the component's
        # tangent; through log_lik's backward (per sample, (B, K, V)), which
        # is differentiable again, so that second derivatives by jvp compose.
        counts, log_alpha = _primals(ctx.saved_tensors)
        (B, V), K = counts.shape, log_alpha.shape[0]
        ones = torch.ones((B, K), dtype=log_alpha.dtype, device=log_alpha.device)
        per_sample, _ = _LogLikBackward.apply(
            ones, counts[:, None].expand(B, K, V).contiguous(),
            log_alpha[None].expand(B, K, V).contiguous(), False, False)
        return (per_sample * t_la).sum(-1)


def _regression_log_alpha(X, W, bias):
    log_alpha = X @ W
    return log_alpha + bias if bias is not None else log_alpha


class _Regression(torch.autograd.Function):
    """dirmult::log_lik_regression: the fused forward; the derivatives
    through log_lik's functions at log_alpha = X @ W + bias (differentiable
    again, where the fused backward op is not)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(counts, X, W, bias, normalize):
        return ops.log_lik_regression(counts, X, W, bias, normalize)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)  # (tangents of non-dual inputs arrive as None)
        counts, X, W, bias, normalize = inputs
        ctx.has_bias = bias is not None
        saved = (counts, X, W) + ((bias,) if bias is not None else ())
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)
        ctx.normalize = normalize

    @staticmethod
    def backward(ctx, grad):
        counts, X, W, *rest = ctx.saved_tensors
        bias = rest[0] if ctx.has_bias else None
        if ctx.needs_input_grad[0]:
            raise NotImplementedError(
                "dirmult: log_lik_regression has no gradient with respect to counts")
        G, _ = _LogLikBackward.apply(grad, counts, _regression_log_alpha(X, W, bias),
                                     ctx.normalize, False)
        need = ctx.needs_input_grad
        return (None, G @ W.t() if need[1] else None, X.t() @ G if need[2] else None,
                G.sum(0) if bias is not None and need[3] else None, None)

    @staticmethod
    def jvp(ctx, t_counts, t_X, t_W, t_bias, _normalize):
        if t_counts is not None:
            raise NotImplementedError(
                "dirmult: log_lik_regression has no derivative with respect to counts")
        with forward_ad_in_jvp():
            return _Regression._jvp(ctx, t_X, t_W, t_bias)

    @staticmethod
    def _jvp(ctx, t_X, t_W, t_bias):
        counts, X, W, *rest = _primals(ctx.saved_tensors)
        bias = rest[0] if ctx.has_bias else None
        t_la = torch.zeros((), dtype=X.dtype, device=X.device)
        if t_X is not None:
            t_la = t_la + t_X @ W
        if t_W is not None:
            t_la = t_la + X @ t_W
        if t_bias is not None:
            t_la = t_la + t_bias
        ones = torch.ones(counts.shape[:-1], dtype=X.dtype, device=X.device)
        per_row, _ = _LogLikBackward.apply(ones, counts, _regression_log_alpha(X, W, bias),
                                           ctx.normalize, False)
        return (per_row * t_la).sum(-1)


class _Dadpoch(_SecondDerivative):
    """dadpoch(a, n) = d adpoch / d log a (tpoch_terms' second term): the
    derivative of :class:`_Adpoch`; none of its own."""

    @staticmethod
    def forward(log_a, n):
        return _elementwise(lambda a, x: ops.tpoch_terms(a, x)[1], log_a, n)


class _Adpoch(torch.autograd.Function):
    """adpoch(a, n) = a (psi(a + n) - psi(a)) (poch_terms' second term), a
    function of log a, differentiable once more (dadpoch)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(log_a, n):
        return _elementwise(lambda a, x: ops.poch_terms(a, x)[1], log_a, n)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)  # (tangents of non-dual inputs arrive as None)
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, g):
        log_a, n = ctx.saved_tensors
        if ctx.needs_input_grad[1]:
            raise _csr_values_error()
        return None if g is None else g * _Dadpoch.apply(log_a, n), None

    @staticmethod
    def jvp(ctx, t_log_a, t_n):
        if t_n is not None:
            raise _csr_values_error()
        with forward_ad_in_jvp():
            log_a, n = _primals(ctx.saved_tensors)
            return t_log_a * _Dadpoch.apply(log_a, n)


def _csr_values_error():
    return NotImplementedError("dirmult: log_lik_csr has no derivative with respect to the "
                               "counts' values (only the concentrations')")


def _elementwise(fn, log_a, n):
    log_a, n = torch.broadcast_tensors(log_a, n)
    return fn(log_a.contiguous(), n.contiguous())


def _rows_dot(row, col, x, B, log_alpha, t, adpoch):
    """Each row's gradient of log_lik (with respect to log_alpha, (V,) or
    (K, V)) contracted with t (log_alpha's shape): (B,) or (B, K). Over the
    nonzeros j (row[j], col[j], x[j]): out[b] = sum_j adpoch(a[col_j], x_j)
    t[col_j] - adpoch(A, N_b) sum_v a_v t_v / A."""
    lead = tuple(log_alpha.shape[:-1])
    per_nz = adpoch(log_alpha[..., col], x) * t[..., col]
    by_row = per_nz.new_zeros(lead + (B,)).index_add(-1, row, per_nz)
    N = x.new_zeros(B).index_add(0, row, x)
    log_A = torch.logsumexp(log_alpha, -1, keepdim=True)
    share = (log_alpha.exp() * t).sum(-1, keepdim=True) / log_A.exp()
    out = by_row - adpoch(log_A, N) * share
    return out.movedim(0, -1) if lead else out


def _masked(g, terms):
    # Rows whose incoming gradient is 0 do not enter, as in the dense double
    # backward and the first-order kernels (their bad counts do not make it NaN).
    return torch.where(g != 0, g * terms, torch.zeros((), dtype=terms.dtype,
                                                      device=terms.device))


def _csr_hessian_dot(grad, row, col, x, B, log_alpha, w):
    """The gradient's (sum_b grad_b row b's gradient) derivative with
    respect to log_alpha contracted with w (symmetric: the jvp and the vjp
    alike), as log_lik's double backward (Note [Trigamma terms] in
    .second_derivatives) over the nonzeros."""
    g = grad if log_alpha.dim() == 1 else grad.t()  # (B,) or (K, B)
    la_nz = log_alpha[..., col]
    dad = _elementwise(lambda a, n: ops.tpoch_terms(a, n)[1], la_nz, x)
    lead = tuple(log_alpha.shape[:-1])
    s1 = dad.new_zeros(lead + (log_alpha.shape[-1],)).index_add(-1, col,
                                                                 _masked(g[..., row], dad))
    N = x.new_zeros(B).index_add(0, row, x)
    log_A = torch.logsumexp(log_alpha, -1, keepdim=True)
    a2t_row, dad_row = _elementwise(ops.tpoch_terms, log_A, N)
    r1 = _masked(g, dad_row).sum(-1, keepdim=True)
    r2 = _masked(g, a2t_row).sum(-1, keepdim=True)
    a, A = log_alpha.exp(), log_A.exp()
    c = (a * w).sum(-1, keepdim=True) / A
    return w * s1 - (a / A) * (w * r1 + (c - w) * r2)


def _adpoch_op(log_a, n):
    return _elementwise(lambda a, x: ops.poch_terms(a, x)[1], log_a, n)


class _CsrSecond(_SecondDerivative):
    """log_lik_csr_backward's derivatives as one function of (w, grad,
    crow, values, csc parts, log_alpha): (d_grad, d_log_alpha)."""

    @staticmethod
    def forward(w, grad, crow, ptr, rows, csc_values, log_alpha):
        B, nnz = crow.shape[0] - 1, rows.shape[0]
        col = row_of_nonzero(ptr, nnz)  # (the column of each column-sorted nonzero)
        x = csc_values.to(log_alpha.dtype)
        d_grad = _rows_dot(rows, col, x, B, log_alpha, w, _adpoch_op)
        d_la = _csr_hessian_dot(grad, rows, col, x, B, log_alpha, w)
        return d_grad, d_la


class _CsrBackward(torch.autograd.Function):
    """dirmult::log_lik_csr_backward, differentiable once more with respect
    to the incoming gradient and log_alpha (a third derivative raises)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(grad, crow, values, ptr, rows, csc_values, log_alpha):
        return ops.log_lik_csr_backward(grad.contiguous(), crow, values, ptr, rows, csc_values,
                                        log_alpha)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx, w):
        grad, crow, values, ptr, rows, csc_values, log_alpha = ctx.saved_tensors
        need = ctx.needs_input_grad
        if need[2] or need[5]:
            raise _csr_values_error()
        if w is None or not (need[0] or need[6]):
            return (None,) * 7
        d_grad, d_la = _CsrSecond.apply(w, grad, crow, ptr, rows, csc_values, log_alpha)
        return (d_grad if need[0] else None, None, None, None, None, None,
                d_la if need[6] else None)

    @staticmethod
    def jvp(ctx, t_grad, _t_crow, t_values, _t_ptr, _t_rows, t_csc_values, t_la):
        if t_values is not None or t_csc_values is not None:
            raise _csr_values_error()
        with forward_ad_in_jvp():
            grad, crow, values, ptr, rows, csc_values, log_alpha = _primals(ctx.saved_tensors)
            out = torch.zeros_like(log_alpha)
            if t_la is not None:
                out = out + _CsrSecond.apply(t_la, grad, crow, ptr, rows, csc_values,
                                             log_alpha)[1]
            if t_grad is not None:
                out = out + _CsrBackward.apply(t_grad, crow, values, ptr, rows, csc_values,
                                               log_alpha)
            return out


class _Csr(torch.autograd.Function):
    """dirmult::log_lik_csr, with respect to log_alpha ((V,) or (K, V))."""
    generate_vmap_rule = True

    @staticmethod
    def forward(crow, col, values, log_alpha, normalize, ptr, rows, csc_values):
        return ops.log_lik_csr(crow, col, values, log_alpha, normalize)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)  # (tangents of non-dual inputs arrive as None)
        crow, col, values, log_alpha, normalize, ptr, rows, csc_values = inputs
        # (The same tensors for both: a generated vmap rule keeps one record
        # of the saved tensors' batch dimensions, the last saved.)
        saved = (crow, col, values, log_alpha, ptr, rows, csc_values)
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    @staticmethod
    def backward(ctx, grad):
        crow, _, values, log_alpha, ptr, rows, csc_values = ctx.saved_tensors
        if ctx.needs_input_grad[2]:
            raise _csr_values_error()
        return (None, None, None, _CsrBackward.apply(grad, crow, values, ptr, rows, csc_values,
                                                     log_alpha), None, None, None, None)

    @staticmethod
    def jvp(ctx, t_crow, t_col, t_values, t_la, _normalize, _ptr, _rows, _csc_values):
        if t_values is not None:
            raise _csr_values_error()
        with forward_ad_in_jvp():
            crow, col, values, log_alpha = _primals(ctx.saved_tensors[:4])
            B = crow.shape[0] - 1
            # Through _Adpoch: differentiable again (second derivatives by jvp).
            return _rows_dot(row_of_nonzero(crow, col.shape[0]), col,
                             values.to(log_alpha.dtype), B, log_alpha, t_la, _Adpoch.apply)


# ------------------------------------------------------------ entry points
def log_lik(counts, log_alpha, normalize: bool):
    """dirmult::log_lik under the transforms (checked arguments)."""
    return _LogLik.apply(counts, log_alpha, normalize)


def log_lik_components(counts, log_alpha, normalize: bool):
    """dirmult::log_lik_components under the transforms."""
    return _Components.apply(counts, log_alpha, normalize)


def log_lik_regression(counts, X, W, bias, normalize: bool):
    """dirmult::log_lik_regression under the transforms."""
    return _Regression.apply(counts, X, W, bias, normalize)


def log_lik_csr(crow, col, values, log_alpha, normalize: bool, csc):
    """dirmult::log_lik_csr under the transforms; csc: the column-sorted
    copy of the parts (csr.csc_parts) the gradient reads."""
    return _Csr.apply(crow, col, values, log_alpha, normalize, *csc)


register_transformed(ops.log_lik.default, log_lik)
register_transformed(ops.log_lik_components.default, log_lik_components)
register_transformed(ops.log_lik_regression.default, log_lik_regression)
