"""Loads the native libraries and gives the dirmult ops their fake (meta)
kernels and autograd formulas.

The op schemas and the CPU kernels live in ``_C`` (loaded on import); the
CUDA kernels live in ``_C_cuda.so``, loaded only when this torch has CUDA.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from . import _C

_HERE = Path(__file__).resolve().parent
BUILD_INFO: dict = dict(_C.build_info())


def _cuda_major(version: str) -> str:
    return version.split(".")[0] if version else ""


# The released CUDA variants, by the CUDA major version of torch.
_WHEEL_VARIANTS = {"12": "+cu128", "13": "+cu130"}


def _load_cuda_kernels() -> bool:
    lib = _HERE / "_C_cuda.so"
    if torch.version.cuda is None or not lib.exists():
        return False
    built = BUILD_INFO["cuda_version"]
    if not built:  # a CPU-only build; a stray library is not ours to load
        return False
    if _cuda_major(built) != _cuda_major(torch.version.cuda):
        tag = _WHEEL_VARIANTS.get(_cuda_major(torch.version.cuda),
                                  "+cu" + torch.version.cuda.replace(".", ""))
        raise ImportError(
            f"dirmult_ext was built for CUDA {built} but this torch uses CUDA "
            f"{torch.version.cuda}. Install the dirmult_ext wheel for your torch's CUDA, "
            f"'dirmult_ext==<version>{tag}' (see docs/install.md), or build from "
            "source against this torch.")
    torch.ops.load_library(str(lib))
    return True


# The ways float32 log_lik_components may be forced to take on CUDA
# (src/cuda/ops_cuda.h reads the variable once per process and raises on
# other values too; checked here as well because some torch builds crash on
# a C++ error instead of raising it).
COMPONENTS_WAYS = ("auto", "fused", "per_component")


def _components_way() -> str:
    way = os.environ.get("DIRMULT_CUDA_COMPONENTS", "")
    if way and way not in COMPONENTS_WAYS:
        raise ValueError(f"DIRMULT_CUDA_COMPONENTS must be one of {', '.join(COMPONENTS_WAYS)} "
                         f"(or unset), got {way!r}")
    return way or "auto"


COMPONENTS_WAY = _components_way()
CUDA_KERNELS = _load_cuda_kernels()
ops = torch.ops.dirmult


# ---------------------------------------------------------------- fake kernels
@torch.library.register_fake("dirmult::log_lik")
def _log_lik_fake(counts, log_alpha, normalize=False):
    return counts.new_empty(counts.shape[:-1], dtype=log_alpha.dtype)


@torch.library.register_fake("dirmult::log_lik_backward")
def _log_lik_backward_fake(grad, counts, log_alpha, normalize, counts_grad):
    grad_counts_shape = counts.shape if counts_grad else (0,)
    return (torch.empty_like(log_alpha),
            counts.new_empty(grad_counts_shape, dtype=log_alpha.dtype))


@torch.library.register_fake("dirmult::log_lik_components")
def _components_fake(counts, log_alpha, normalize=False):
    return counts.new_empty((counts.shape[0], log_alpha.shape[0]), dtype=log_alpha.dtype)


@torch.library.register_fake("dirmult::log_lik_components_backward")
def _components_backward_fake(grad, counts, log_alpha):
    return torch.empty_like(log_alpha)


@torch.library.register_fake("dirmult::log_lik_with_grad")
def _log_lik_with_grad_fake(counts, log_alpha, normalize=False):
    return (counts.new_empty(counts.shape[:-1], dtype=log_alpha.dtype),
            torch.empty_like(log_alpha))


@torch.library.register_fake("dirmult::poch_terms")
def _poch_terms_fake(log_alpha, n):
    return torch.empty_like(log_alpha), torch.empty_like(log_alpha)


# -------------------------------------------------------------------- autograd
def _log_lik_setup(ctx, inputs, output):
    counts, log_alpha, normalize = inputs
    ctx.save_for_backward(counts, log_alpha)
    ctx.normalize = normalize


def _log_lik_backward(ctx, grad):
    counts, log_alpha = ctx.saved_tensors
    need_counts = bool(ctx.needs_input_grad[0])
    grad_la, grad_counts = ops.log_lik_backward.default(
        grad.contiguous(), counts, log_alpha, ctx.normalize, need_counts)
    return (grad_counts.to(counts.dtype) if need_counts else None,
            grad_la if ctx.needs_input_grad[1] else None,
            None)


torch.library.register_autograd("dirmult::log_lik", _log_lik_backward,
                                setup_context=_log_lik_setup)


def _components_setup(ctx, inputs, output):
    counts, log_alpha, normalize = inputs
    ctx.save_for_backward(counts, log_alpha)


def _components_backward(ctx, grad):
    counts, log_alpha = ctx.saved_tensors
    if ctx.needs_input_grad[0]:
        raise NotImplementedError(
            "dirmult: log_lik_components has no gradient with respect to counts")
    grad_la = ops.log_lik_components_backward.default(grad.contiguous(), counts, log_alpha)
    return None, grad_la, None


torch.library.register_autograd("dirmult::log_lik_components", _components_backward,
                                setup_context=_components_setup)


# ------------------------------------------------- the eager fast path (Python API)
# register_autograd's generic wrapper costs tens of microseconds per forward +
# backward on the host (its own autograd.Function, argument re-packing, a
# Python redispatch even when no gradient is needed), which is most of a
# small problem's time. In plain eager mode the Python API calls the ops
# through this lean path instead: the same setup and backward functions, the
# kernel reached directly below the Autograd key. Under torch.compile/export
# and functorch transforms it calls the registered op, whose formulas are the
# same.
_BELOW_AUTOGRAD = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
_FUNCTORCH_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)


_HAS_EAGER_PATH = _BELOW_AUTOGRAD is not None and _FUNCTORCH_ACTIVE is not None
_is_compiling = torch.compiler.is_compiling


def _eager() -> bool:
    return _HAS_EAGER_PATH and not _is_compiling() and not _FUNCTORCH_ACTIVE()


class _Components(torch.autograd.Function):
    """log_lik_components with the registered formulas: the op is called
    below the Autograd key, then the setup as torch would."""

    @staticmethod
    def forward(ctx, counts, log_alpha, normalize):
        with _BELOW_AUTOGRAD():
            out = ops.log_lik_components.default(counts, log_alpha, normalize)
        _components_setup(ctx, (counts, log_alpha, normalize), out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _components_backward(ctx, grad)


# The single pass (dirmult::log_lik_with_grad) reads the counts once for the
# forward and the gradient of the rows' sum. Its kernels serve shared
# log_alpha over at least this many rows: on CUDA float32 from one row
# (src/cuda/log_lik_with_grad.cu; the tables serve any number of rows), on
# CPU from 64 (kRowsForRowsOnly in src/cpu/log_lik_cpu.cpp: fewer, long rows
# are split into column chunks by the forward and the backward). Elsewhere
# the op is a forward plus a backward and would only move the backward's
# work into the forward.
_SINGLE_PASS_MIN_ROWS_CUDA = 1
_SINGLE_PASS_MIN_ROWS_CPU = 64


def _single_pass_applies(ctx, counts, log_alpha) -> bool:
    if log_alpha.dim() != 1 or counts.dim() < 2 or counts.shape[-1] == 0:
        return False
    if not ctx.needs_input_grad[1] or ctx.needs_input_grad[0]:
        return False
    if counts.is_cuda:
        min_rows = _SINGLE_PASS_MIN_ROWS_CUDA if log_alpha.dtype == torch.float32 else None
    else:
        min_rows = _SINGLE_PASS_MIN_ROWS_CPU if counts.device.type == "cpu" else None
    return min_rows is not None and counts.numel() >= min_rows * counts.shape[-1]


def _is_uniform(grad) -> bool:
    """Every element of grad is one number, known from its strides alone (no
    device read): the gradient of a sum reaches log_lik as an expanded scalar."""
    return grad.numel() <= 1 or all(stride == 0 for stride, size in
                                    zip(grad.stride(), grad.shape) if size > 1)


class _LogLik(torch.autograd.Function):
    """log_lik with the registered formulas, plus the single pass: where it
    applies, the forward also computes the gradient of the rows' sum, and a
    backward whose incoming gradient is one number g for every row, as the
    strides show it for a sum of the rows, returns g times it instead of
    reading the counts again. Any other gradient (a mean arrives dense) takes
    the backward kernels. (Deciding uniformity on the device instead, without
    a synchronization, was measured slower on the H200 machine: its extra
    launches cost more host time than the saved read; BENCHMARKS.md.)"""

    @staticmethod
    def forward(ctx, counts, log_alpha, normalize):
        ctx.grad_of_sum = None
        with _BELOW_AUTOGRAD():
            if _single_pass_applies(ctx, counts, log_alpha):
                out, ctx.grad_of_sum = ops.log_lik_with_grad.default(counts, log_alpha, normalize)
            else:
                out = ops.log_lik.default(counts, log_alpha, normalize)
        _log_lik_setup(ctx, (counts, log_alpha, normalize), out)
        return out

    @staticmethod
    def backward(ctx, grad):
        # (create_graph: the backward op, differentiable; the precomputed
        # gradient is a constant.)
        if ctx.grad_of_sum is not None and _is_uniform(grad) and not torch.is_grad_enabled():
            return None, ctx.grad_of_sum * grad.reshape(-1)[0], None
        return _log_lik_backward(ctx, grad)


def _call(op, function, counts, log_alpha, normalize: bool):
    if not _eager():
        return op(counts, log_alpha, normalize)
    # (Spelled out for two tensors: a generator over them cost ~0.5 us per call.)
    if torch.is_grad_enabled() and (counts.requires_grad or log_alpha.requires_grad):
        return function.apply(counts, log_alpha, normalize)
    with _BELOW_AUTOGRAD():
        return op(counts, log_alpha, normalize)


def call_log_lik(counts, log_alpha, normalize: bool):
    """dirmult::log_lik, by the eager fast path where it applies."""
    return _call(ops.log_lik.default, _LogLik, counts, log_alpha, normalize)


def call_log_lik_components(counts, log_alpha, normalize: bool):
    """dirmult::log_lik_components, by the eager fast path where it applies."""
    return _call(ops.log_lik_components.default, _Components, counts, log_alpha, normalize)


# The backward ops' own autograd formulas (second derivatives).
from . import _double_backward  # noqa: E402,F401
