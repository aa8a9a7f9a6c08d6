"""Loads the native libraries and gives each dirmult op, side by side, its
fake (meta) kernel, its autograd formula and the eager fast path's call of
it; and, where a C++ error would not reach Python, its argument checks in
front of the kernels (see Note [Stable ABI errors]).

The op schemas and the CPU kernels live in ``_C`` (loaded on import); the
CUDA kernels live in ``_C_cuda.so``, loaded only when this torch has CUDA.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch._C import DispatchKey, DispatchKeySet

from . import _C, _checks

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
# (src/cuda/policy.cu reads the variable once per process and raises on
# other values too; checked here on import as well, where the error surely
# reaches Python: see Note [Stable ABI errors]).
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


# ------------------------------------------------- host policy (Note [Single pass])
# The single pass (dirmult::log_lik_with_grad) reads the counts once for the
# forward and the gradient of the rows' sum. Its kernels serve shared
# log_alpha over at least this many rows: on CUDA float32 from one row
# (src/cuda/log_lik_with_grad_cuda.cu; the tables serve any number of rows),
# on CPU from 64 (kRowsForRowsOnly in src/cpu/policy_cpu.h: fewer, long rows
# are split into column chunks by the forward and the backward). Elsewhere
# the op is a forward plus a backward and would only move the backward's
# work into the forward. See Note [Single pass].
_SINGLE_PASS_MIN_ROWS_CUDA = 1
_SINGLE_PASS_MIN_ROWS_CPU = 64


# --------------------------------------------------- argument checks in Python
# See Note [Stable ABI errors]. DIRMULT_OP_CHECKS, read once on import:
# "auto" (or unset): the checks of _checks.py run in front of every op's
# kernels on torch < 2.13, whose stable ABI turns a C++ error into a crash;
# "python": on every torch (how CI exercises them on a newer torch);
# "native": never (only the C++ checks: a bad argument crashes torch < 2.13).
OP_CHECKS_SETTINGS = ("auto", "python", "native")
STABLE_ABI_ERRORS_RAISE = torch.torch_version.TorchVersion(torch.__version__) >= (2, 13)


def _op_checks_setting() -> str:
    value = os.environ.get("DIRMULT_OP_CHECKS", "")
    if value and value not in OP_CHECKS_SETTINGS:
        raise ValueError(f"DIRMULT_OP_CHECKS must be one of {', '.join(OP_CHECKS_SETTINGS)} "
                         f"(or unset), got {value!r}")
    if value in ("", "auto"):
        return "native" if STABLE_ABI_ERRORS_RAISE else "python"
    return value


OP_CHECKS = _op_checks_setting()
_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)


def _checked_kernel(op, check):
    """A BackendSelect kernel: check, then the kernels below. Redispatched
    with the call's own key set: excluding BackendSelect for the rest of the
    thread (a guard) would also hide it from the kernels' factory calls."""
    redispatch = op._handle.redispatch_boxed

    def kernel(keyset, *args, **kwargs):
        check(*args, *kwargs.values())  # (the schemas have no keyword-only arguments)
        return redispatch(keyset & _BELOW_BACKEND_SELECT, *args, **kwargs)
    return kernel


def _register_op_checks():
    # BackendSelect is in every call's key set and sits just above the CPU,
    # CUDA and Meta kernels: TorchScript, torch.compile's and export's code
    # and C++ callers pass it; fake tensors are served above it (their
    # Python key), so tracing never runs the checks; the eager fast path
    # calls the kernels directly, past it.
    lib = torch.library.Library("dirmult", "IMPL")
    for name, check in _checks.OP_CHECKS.items():
        lib.impl(name, _checked_kernel(getattr(ops, name).default, check), "BackendSelect",
                 with_keyset=True)
    return lib


_OP_CHECKS_LIBRARY = _register_op_checks() if OP_CHECKS == "python" else None


# ------------------------------------------------------ the eager fast path's reach
# register_autograd's generic wrapper costs tens of microseconds per forward +
# backward on the host (its own autograd.Function, argument re-packing, a
# Python redispatch even when no gradient is needed), which is most of a
# small problem's time. In plain eager mode (no torch.compile, no functorch
# transform) the Python API, which has checked the arguments, calls the ops
# below the Autograd key instead, through a lean autograd.Function with the
# registered formulas. Where the Python checks sit in front of the kernels,
# it also passes them: it redispatches to the CPU or CUDA kernel directly,
# where nothing else would intercept the call (no dispatch mode or tracer in
# the thread's included keys, no tensor subclass); anything else calls the
# registered op.
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
_FUNCTORCH_ACTIVE = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_PAST_CHECKS = OP_CHECKS == "python"
_TLS_INCLUDED = torch._C._dispatch_tls_local_include_set
_DEFAULT_INCLUDED = (DispatchKeySet(DispatchKey.BackendSelect)
                     | DispatchKeySet(DispatchKey.ADInplaceOrView)).raw_repr()
_CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
_CUDA_KEYS = DispatchKeySet(DispatchKey.CUDA)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _eager() -> bool:
    return not _is_compiling() and not _FUNCTORCH_ACTIVE()


def _kernel_keys(counts, log_alpha):
    """The key set of the kernel the dispatcher would reach below Autograd
    and the checks for these (checked) arguments, where nothing else would
    intercept the call; else None."""
    if (_TLS_INCLUDED().raw_repr() != _DEFAULT_INCLUDED
            or type(counts) not in _PLAIN_TYPES or type(log_alpha) not in _PLAIN_TYPES):
        return None
    if counts.is_cuda:
        return _CUDA_KEYS
    return _CPU_KEYS if counts.is_cpu else None


def _run(op, keys, *args):
    """op(*args) below the Autograd key: the kernel of keys directly, or the
    registered op where keys is None."""
    with _BELOW_AUTOGRAD():
        if keys is None:
            return op(*args)
        return op._handle.redispatch_boxed(keys, *args)


def _run_backward(op, ctx, *args):
    """A backward op: below Autograd as _run, except under create_graph,
    where it goes through its own autograd formula (second derivatives)."""
    if torch.is_grad_enabled():
        return op(*args)
    return _run(op, _backward_keys(ctx), *args)


def _backward_keys(ctx):
    """The forward's kernel keys if nothing intercepts the backward either."""
    keys = ctx.kernel_keys
    if keys is None or _TLS_INCLUDED().raw_repr() != _DEFAULT_INCLUDED:
        return None
    return keys


def _call(op, function, counts, log_alpha, normalize: bool):
    if not _eager():
        return op(counts, log_alpha, normalize)
    keys = _kernel_keys(counts, log_alpha) if _PAST_CHECKS else None
    # (Spelled out for two tensors: a generator over them cost ~0.5 us per call.)
    if torch.is_grad_enabled() and (counts.requires_grad or log_alpha.requires_grad):
        return function.apply(counts, log_alpha, normalize, keys)
    with _BELOW_AUTOGRAD():
        if keys is None:
            return op(counts, log_alpha, normalize)
        return op._handle.redispatch_boxed(keys, counts, log_alpha, normalize)


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
    ctx.kernel_keys = None


def _log_lik_backward(ctx, grad):
    """The formula, for the registered op and the fast path alike."""
    counts, log_alpha = ctx.saved_tensors
    need_counts = bool(ctx.needs_input_grad[0])
    grad_la, grad_counts = _run_backward(ops.log_lik_backward.default, ctx,
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
            out, ctx.grad_of_sum = _run(ops.log_lik_with_grad.default, keys,
                                        counts, log_alpha, normalize)
        else:
            out = _run(ops.log_lik.default, keys, counts, log_alpha, normalize)
        _log_lik_setup(ctx, (counts, log_alpha, normalize), out)
        ctx.kernel_keys = keys
        return out

    @staticmethod
    def backward(ctx, grad):
        # Under create_graph the backward op, which is differentiable, instead
        # of the precomputed gradient (a constant to autograd).
        if (ctx.grad_of_sum is not None and _is_uniform(grad)
                and not torch.is_grad_enabled()):
            return None, ctx.grad_of_sum * grad.reshape(-1)[0], None, None
        return _log_lik_backward(ctx, grad) + (None,)


def call_log_lik(counts, log_alpha, normalize: bool):
    """dirmult::log_lik on checked arguments, by the eager fast path where it
    applies."""
    return _call(ops.log_lik.default, _LogLik, counts, log_alpha, normalize)


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
    ctx.kernel_keys = None


def _components_backward(ctx, grad):
    """The formula, for the registered op and the fast path alike."""
    counts, log_alpha = ctx.saved_tensors
    if ctx.needs_input_grad[0]:
        raise NotImplementedError(
            "dirmult: log_lik_components has no gradient with respect to counts")
    grad_la = _run_backward(ops.log_lik_components_backward.default, ctx,
                            grad.contiguous(), counts, log_alpha)
    return None, grad_la, None


torch.library.register_autograd("dirmult::log_lik_components", _components_backward,
                                setup_context=_components_setup)


class _Components(torch.autograd.Function):
    """The eager fast path of log_lik_components: the registered setup and
    formula around a direct call of the kernel."""

    @staticmethod
    def forward(ctx, counts, log_alpha, normalize, keys):
        out = _run(ops.log_lik_components.default, keys, counts, log_alpha, normalize)
        _components_setup(ctx, (counts, log_alpha, normalize), out)
        ctx.kernel_keys = keys
        return out

    @staticmethod
    def backward(ctx, grad):
        return _components_backward(ctx, grad) + (None,)


def call_log_lik_components(counts, log_alpha, normalize: bool):
    """dirmult::log_lik_components on checked arguments, by the eager fast
    path where it applies."""
    return _call(ops.log_lik_components.default, _Components, counts, log_alpha, normalize)


# ------------------------------------------------------------------ poch_terms
@torch.library.register_fake("dirmult::poch_terms")
def _poch_terms_fake(log_alpha, n):
    return torch.empty_like(log_alpha), torch.empty_like(log_alpha)


# The backward ops' own autograd formulas (second derivatives) and tpoch_terms.
from . import _double_backward  # noqa: E402,F401
# log_lik_regression's fake kernels and autograd.
from . import _regression_ops  # noqa: E402,F401
