"""dirmult::log_lik_regression: its fake
kernels, its autograd formula and the eager fast path's call of it. The
concentrations are ``log_alpha = X @ W + bias`` per row, computed inside the
op (See Note [Regression fusion]); there is no gradient with respect to the
counts."""
from __future__ import annotations

import torch

from .dispatch import call, run, run_backward
from .library import ops

__all__ = ["call_log_lik_regression"]


@torch.library.register_fake("dirmult::log_lik_regression")
def _regression_fake(counts, X, W, bias=None, normalize=False):
    return counts.new_empty((counts.shape[0],), dtype=X.dtype)


@torch.library.register_fake("dirmult::log_lik_regression_backward")
def _regression_backward_fake(grad, counts, X, W, bias, normalize):
    bias_shape = (W.shape[1],) if bias is not None else (0,)
    return X.new_empty(X.shape), W.new_empty(W.shape), X.new_empty(bias_shape)


def _regression_setup(ctx, inputs, output):
    counts, X, W, bias, normalize = inputs
    ctx.save_for_backward(counts, X, W, bias)
    ctx.normalize = normalize


def _regression_backward(ctx, grad):
    """The formula, for the registered op and the fast path alike."""
    counts, X, W, bias = ctx.saved_tensors
    if ctx.needs_input_grad[0]:
        raise NotImplementedError(
            "dirmult: log_lik_regression has no gradient with respect to counts")
    dX, dW, dbias = run_backward(ops.log_lik_regression_backward.default, ctx,
                                  grad.contiguous(), counts, X, W, bias, ctx.normalize)
    return (None,
            dX if ctx.needs_input_grad[1] else None,
            dW if ctx.needs_input_grad[2] else None,
            dbias if bias is not None and ctx.needs_input_grad[3] else None,
            None)


torch.library.register_autograd("dirmult::log_lik_regression", _regression_backward,
                                setup_context=_regression_setup)


class _Regression(torch.autograd.Function):
    """The eager fast path of log_lik_regression: the registered setup and
    formula around a direct call of the kernel."""

    @staticmethod
    def forward(ctx, counts, X, W, bias, normalize, keys):
        out = run(ops.log_lik_regression.default, keys, counts, X, W, bias, normalize)
        _regression_setup(ctx, (counts, X, W, bias, normalize), out)
        ctx.kernel_keys = keys
        return out

    @staticmethod
    def backward(ctx, grad):
        return _regression_backward(ctx, grad) + (None,)


def call_log_lik_regression(counts, X, W, bias, normalize: bool):
    """dirmult::log_lik_regression on checked arguments, by the eager fast
    path where it applies (counts that require grad take the autograd path
    too, whose backward says there is no such gradient)."""
    return call(ops.log_lik_regression.default, _Regression, 4, counts, X, W, bias, normalize)
