"""dirmult::log_lik and its single pass, dirmult::log_lik_with_grad, for
dense counts: the fake (meta) kernels, the autograd formula and the eager
fast path's call, side by side (the backward ops' own formulas, second
derivatives, are in .second_derivatives)."""
from __future__ import annotations

import torch

from .dispatch import call, is_uniform, run, run_backward
from .library import ops

__all__ = ["call_log_lik", "SINGLE_PASS_MIN_ROWS_CPU", "SINGLE_PASS_MIN_ROWS_CUDA"]

# ------------------------------------------------- host policy (Note [Single pass])
# The single pass (dirmult::log_lik_with_grad) reads the counts once for the
# forward and the gradient of the rows' sum. Its kernels serve shared
# log_alpha over at least this many rows: on CUDA float32 from one row
# (src/cuda/log_lik_with_grad_cuda.cu; the tables serve any number of rows),
# on CPU from 64 (kRowsForRowsOnly in src/cpu/policy_cpu.h: fewer, long rows
# are split into column chunks by the forward and the backward). Elsewhere
# the op is a forward plus a backward and would only move the backward's
# work into the forward. See Note [Single pass].
SINGLE_PASS_MIN_ROWS_CUDA = 1
SINGLE_PASS_MIN_ROWS_CPU = 64



# --------------------------------------------------------------------- log_lik
@torch.library.register_fake("dirmult::log_lik")
def _log_lik_fake(counts, log_alpha, normalize=False):
    return counts.new_empty(counts.shape[:-1], dtype=log_alpha.dtype)


@torch.library.register_fake("dirmult::log_lik_backward")
def _log_lik_backward_fake(grad, counts, log_alpha, normalize, counts_grad):
    grad_counts_shape = counts.shape if counts_grad else (0,)
    return (torch.empty_like(log_alpha),
            counts.new_empty(grad_counts_shape, dtype=log_alpha.dtype))


@torch.library.register_fake("dirmult::log_lik_with_grad")
def _log_lik_with_grad_fake(counts, log_alpha, normalize=False):
    return (counts.new_empty(counts.shape[:-1], dtype=log_alpha.dtype),
            torch.empty_like(log_alpha))


def _log_lik_setup(ctx, inputs, output):
    counts, log_alpha, normalize = inputs
    ctx.save_for_backward(counts, log_alpha)
    ctx.normalize = normalize


def _log_lik_backward(ctx, grad):
    """The formula, for the registered op and the fast path alike."""
    counts, log_alpha = ctx.saved_tensors
    need_counts = bool(ctx.needs_input_grad[0])
    grad_la, grad_counts = run_backward(ops.log_lik_backward.default, ctx,
                                         grad.contiguous(), counts, log_alpha, ctx.normalize, need_counts)
    return (grad_counts.to(counts.dtype) if need_counts else None,
            grad_la if ctx.needs_input_grad[1] else None,
            None)


torch.library.register_autograd("dirmult::log_lik", _log_lik_backward,
                                setup_context=_log_lik_setup)


def _single_pass_applies(ctx, counts, log_alpha) -> bool:
    if log_alpha.dim() != 1 or counts.dim() < 2 or counts.shape[-1] == 0:
        return False
    if not ctx.needs_input_grad[1] or ctx.needs_input_grad[0]:
        return False
    if counts.is_cuda:
        min_rows = SINGLE_PASS_MIN_ROWS_CUDA if log_alpha.dtype == torch.float32 else None
    else:
        min_rows = SINGLE_PASS_MIN_ROWS_CPU if counts.device.type == "cpu" else None
    return min_rows is not None and counts.numel() >= min_rows * counts.shape[-1]


class _LogLik(torch.autograd.Function):
    """The eager fast path of log_lik: the registered setup and formula,
    plus the single pass (Note [Single pass]): where it applies, the forward
    also computes the gradient of the rows' sum, and a backward whose
    incoming gradient is one number g for every row, as the strides show it
    for a sum of the rows, returns g times it instead of reading the counts
    again. Any other gradient (a mean arrives dense) takes the formula.
    (Deciding uniformity on the device instead, without a synchronization,
    was measured slower on the H200 machine: its extra launches cost more
    host time than the saved read; BENCHMARKS.md.)"""

    @staticmethod
    def forward(ctx, counts, log_alpha, normalize, keys):
        ctx.grad_of_sum = None
        if _single_pass_applies(ctx, counts, log_alpha):
            out, ctx.grad_of_sum = run(ops.log_lik_with_grad.default, keys,
                                        counts, log_alpha, normalize)
        else:
            out = run(ops.log_lik.default, keys, counts, log_alpha, normalize)
        _log_lik_setup(ctx, (counts, log_alpha, normalize), out)
        ctx.kernel_keys = keys
        return out

    @staticmethod
    def backward(ctx, grad):
        # Under create_graph the backward op, which is differentiable, instead
        # of the precomputed gradient (a constant to autograd).
        if (ctx.grad_of_sum is not None and is_uniform(grad)
                and not torch.is_grad_enabled()):
            return None, ctx.grad_of_sum * grad.reshape(-1)[0], None, None
        return _log_lik_backward(ctx, grad) + (None,)


def call_log_lik(counts, log_alpha, normalize: bool):
    """dirmult::log_lik on checked arguments, by the eager fast path where it
    applies."""
    return call(ops.log_lik.default, _LogLik, 2, counts, log_alpha, normalize)
