"""dirmult::log_lik_components, K concentration vectors against every row
(the E-step of a mixture): its fake kernels, autograd formula and the eager
fast path's call, side by side."""
from __future__ import annotations

import torch

from .dispatch import call, run, run_backward
from .library import ops

__all__ = ["call_log_lik_components"]

# ---------------------------------------------------------- log_lik_components
@torch.library.register_fake("dirmult::log_lik_components")
def _components_fake(counts, log_alpha, normalize=False):
    return counts.new_empty((counts.shape[0], log_alpha.shape[0]), dtype=log_alpha.dtype)


@torch.library.register_fake("dirmult::log_lik_components_backward")
def _components_backward_fake(grad, counts, log_alpha):
    return torch.empty_like(log_alpha)


def _components_setup(ctx, inputs, output):
    counts, log_alpha, normalize = inputs
    ctx.save_for_backward(counts, log_alpha)


def _components_backward(ctx, grad):
    """The formula, for the registered op and the fast path alike."""
    counts, log_alpha = ctx.saved_tensors
    if ctx.needs_input_grad[0]:
        raise NotImplementedError(
            "dirmult: log_lik_components has no gradient with respect to counts")
    grad_la = run_backward(ops.log_lik_components_backward.default, ctx,
                            grad.contiguous(), counts, log_alpha)
    return None, grad_la, None


torch.library.register_autograd("dirmult::log_lik_components", _components_backward,
                                setup_context=_components_setup)


class _Components(torch.autograd.Function):
    """The eager fast path of log_lik_components: the registered setup and
    formula around a direct call of the kernel."""

    @staticmethod
    def forward(ctx, counts, log_alpha, normalize, keys):
        out = run(ops.log_lik_components.default, keys, counts, log_alpha, normalize)
        _components_setup(ctx, (counts, log_alpha, normalize), out)
        ctx.kernel_keys = keys
        return out

    @staticmethod
    def backward(ctx, grad):
        return _components_backward(ctx, grad) + (None,)


def call_log_lik_components(counts, log_alpha, normalize: bool):
    """dirmult::log_lik_components on checked arguments, by the eager fast
    path where it applies."""
    return call(ops.log_lik_components.default, _Components, 2, counts, log_alpha, normalize)
