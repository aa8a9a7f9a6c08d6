"""The one door to torch's private dispatcher APIs: the eager fast path that
calls an op's kernel below the Autograd key, and the Python argument checks'
redispatch in front of the kernels.

Why a fast path: ``register_autograd``'s generic wrapper costs tens of
microseconds per forward + backward on the host (its own autograd.Function,
argument re-packing, a Python redispatch even when no gradient is needed),
which is most of a small problem's time (BENCHMARKS.md, "Per-call cost").
In plain eager mode (no torch.compile, no functorch transform) the public
functions, which have checked the arguments, call the ops below the Autograd
key instead, through a lean autograd.Function with the registered formulas.
Where the Python checks sit in front of the kernels, it also passes them: it
redispatches to the CPU or CUDA kernel directly, where nothing else would
intercept the call (no dispatch mode or tracer in the thread's included
keys, no tensor subclass); anything else calls the registered op.

Every private name used is looked up once, here. Where a torch lacks one, or
``DIRMULT_FAST_PATH=0`` is set, :data:`FAST_PATH` is False and every call
takes the registered op (the public path: the same results, slower on small
problems). CI runs the op tests both ways.
"""
from __future__ import annotations

import contextlib
import os

import torch

__all__ = ["FAST_PATH", "call", "run", "run_backward", "eager", "is_uniform",
           "checked_kernel", "past_checks", "transforms_active", "register_transformed",
           "forward_ad_in_jvp", "primal", "outside_transforms", "is_transform_wrapped"]

# The checks' redispatch (registered only on torch < 2.13, which has these).
try:
    from torch._C import DispatchKey, DispatchKeySet
    _BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(DispatchKey.BackendSelect)
except (AttributeError, ImportError):
    _BELOW_BACKEND_SELECT = None

try:
    _BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
    _TLS_INCLUDED = torch._C._dispatch_tls_local_include_set
    _DEFAULT_INCLUDED = (DispatchKeySet(DispatchKey.BackendSelect)
                         | DispatchKeySet(DispatchKey.ADInplaceOrView)).raw_repr()
    _CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
    _CUDA_KEYS = DispatchKeySet(DispatchKey.CUDA)
    _INTERNALS = hasattr(torch.ops.aten.add.Tensor._handle, "redispatch_boxed")
except (AttributeError, NameError):  # a torch that moved them: the public path
    _INTERNALS = False

# (torch.func support needs these even off the fast path.)
_FUNCTORCH_ACTIVE = (getattr(torch._C, "_are_functorch_transforms_active", None)
                     or (lambda: False))
_FORWARD_AD = torch.autograd.forward_ad
# torch runs an autograd.Function's jvp staticmethod with forward AD off;
# .transforms turns it back on there (Note [Forward over forward]).
_SET_FWD_GRAD_ENABLED = getattr(_FORWARD_AD, "_set_fwd_grad_enabled", None)
_DISABLE_FUNCTORCH = getattr(torch._C, "_DisableFuncTorch", None)
_FUNCTORCH = getattr(torch._C, "_functorch", None)
_IS_WRAPPED = getattr(_FUNCTORCH, "is_functorch_wrapped_tensor", None)
try:
    _IS_BATCHED = _FUNCTORCH.is_batchedtensor
    _UNWRAP_BATCHED = _FUNCTORCH._unwrap_batched
    _ADD_BATCH_DIM = _FUNCTORCH._add_batch_dim
except AttributeError:
    _IS_BATCHED = None


def _transforms_active_now() -> bool:
    """A functorch transform is active, or a ``torch.autograd.forward_ad``
    dual level is entered: both take the ops' transform-aware functions,
    whose ``jvp`` is the only forward-mode derivative the ops have."""
    return _FUNCTORCH_ACTIVE() or _FORWARD_AD._current_level >= 0


_TRANSFORMS_ACTIVE = _transforms_active_now

#: Whether eager calls take the fast path (else the registered op).
FAST_PATH = _INTERNALS and os.environ.get("DIRMULT_FAST_PATH", "1") != "0"
_is_compiling = torch.compiler.is_compiling
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_past_checks = False


def past_checks(enabled: bool) -> None:
    """Whether the fast path calls the CPU/CUDA kernels directly, past the
    Python checks registered in front of them (set by .library on import)."""
    global _past_checks
    _past_checks = bool(enabled) and FAST_PATH


def eager() -> bool:
    """Plain eager mode: not compiling, no functorch transform active."""
    if not FAST_PATH:
        return False
    return not _is_compiling() and not _TRANSFORMS_ACTIVE()


def transforms_active() -> bool:
    """A torch.func transform (grad, vmap, jvp, ...) or a forward-mode AD
    dual level is active and this is not a torch.compile trace: the public
    functions then call the ops through .transforms (Note [torch.func])."""
    return not _is_compiling() and _TRANSFORMS_ACTIVE()


def forward_ad_in_jvp():
    """A context manager turning forward-mode AD on inside an
    autograd.Function's ``jvp``, so that an enclosing forward-mode level
    sees the tangent's dependence on the point (Note [Forward over forward])."""
    if _SET_FWD_GRAD_ENABLED is None:
        raise RuntimeError(
            "dirmult: this torch has no torch.autograd.forward_ad._set_fwd_grad_enabled; "
            "forward-mode derivatives of the dirmult ops (jvp, jacfwd) are unavailable. "
            "Use reverse mode (grad, jacrev; hessian as jacrev(jacrev)).")
    return _SET_FWD_GRAD_ENABLED(True)


def primal(t):
    """t without the current forward-mode level's tangent, keeping every
    other level's (Note [Forward over forward]). ``unpack_dual`` has no
    batching rule: a tensor batched by vmap (the jvp of a generated vmap
    rule sees its saved tensors so) is unwrapped, unpacked and batched again."""
    if _IS_BATCHED is not None and _IS_BATCHED(t):
        inner, bdim = _UNWRAP_BATCHED(t, _FUNCTORCH.maybe_get_level(t))
        return _ADD_BATCH_DIM(primal(inner), bdim, _FUNCTORCH.maybe_get_level(t))
    return _FORWARD_AD.unpack_dual(t).primal


def outside_transforms():
    """A context manager in which tensors not created by a torch.func
    transform are plain again to torch's ops (a sparse tensor, which the
    transforms' layers cannot read, converted before entering the op)."""
    return _DISABLE_FUNCTORCH() if _DISABLE_FUNCTORCH is not None else contextlib.nullcontext()


def is_transform_wrapped(t) -> bool:
    """Whether t is a torch.func transform's tensor (batched or tracked by
    grad/jvp), not a plain one closed over."""
    return _IS_WRAPPED is not None and isinstance(t, torch.Tensor) and bool(_IS_WRAPPED(t))


def _kernel_keys(tensors):
    """The key set of the kernel the dispatcher would reach below Autograd
    for these (checked) tensors, where nothing else would intercept the
    call; else None. ``None`` entries (an absent bias) are skipped."""
    if _TLS_INCLUDED().raw_repr() != _DEFAULT_INCLUDED:
        return None
    for t in tensors:
        if t is not None and type(t) not in _PLAIN_TYPES:
            return None
    first = tensors[0]
    if first.is_cuda:
        return _CUDA_KEYS
    return _CPU_KEYS if first.is_cpu else None


def run(op, keys, *args):
    """op(*args) below the Autograd key: the kernel of keys directly, or the
    registered op where keys is None."""
    with _BELOW_AUTOGRAD():
        if keys is None:
            return op(*args)
        return op._handle.redispatch_boxed(keys, *args)


def run_backward(op, ctx, *args):
    """A backward op called from an autograd formula: below Autograd as
    :func:`run` when the forward took the fast path, except under
    create_graph, where it goes through its own autograd formula (second
    derivatives)."""
    keys = getattr(ctx, "kernel_keys", None)
    if torch.is_grad_enabled() or not FAST_PATH or not eager():
        return op(*args)
    if keys is not None and _TLS_INCLUDED().raw_repr() != _DEFAULT_INCLUDED:
        keys = None
    return run(op, keys, *args)


# op -> its call under the torch.func transforms (registered by .transforms).
_TRANSFORMED: dict = {}


def register_transformed(op, fn) -> None:
    """``call`` runs ``fn(*args)`` instead of ``op`` while a torch.func
    transform is active (Note [torch.func])."""
    _TRANSFORMED[op] = fn


def call(op, function, n_tensors: int, *args):
    """``op(*args)`` for checked arguments whose first ``n_tensors`` are the
    tensors (None allowed): by ``function`` (an autograd.Function taking
    ``*args, keys``) where a gradient is needed, below Autograd otherwise;
    under a torch.func transform its registered form; the registered op
    elsewhere (compiling, or off the fast path)."""
    if _is_compiling():
        return op(*args)
    if _FUNCTORCH_ACTIVE() or _FORWARD_AD._current_level >= 0:  # (_TRANSFORMS_ACTIVE inline)
        return _TRANSFORMED.get(op, op)(*args)
    if not FAST_PATH:
        return op(*args)
    tensors = args[:n_tensors]
    keys = _kernel_keys(tensors) if _past_checks else None
    if torch.is_grad_enabled():
        for t in tensors:  # (a loop: a generator cost ~0.5 us per call)
            if t is not None and t.requires_grad:
                return function.apply(*args, keys)
    with _BELOW_AUTOGRAD():
        if keys is None:
            return op(*args)
        return op._handle.redispatch_boxed(keys, *args)


def is_uniform(grad) -> bool:
    """Every element of grad is one number, known from its strides alone (no
    device read): the gradient of a sum reaches log_lik as an expanded scalar."""
    return grad.numel() <= 1 or all(stride == 0 for stride, size in
                                    zip(grad.stride(), grad.shape) if size > 1)


def checked_kernel(op, check):
    """A BackendSelect kernel: check, then the kernels below. Redispatched
    with the call's own key set: excluding BackendSelect for the rest of the
    thread (a guard) would also hide it from the kernels' factory calls."""
    redispatch = op._handle.redispatch_boxed

    def kernel(keyset, *args, **kwargs):
        check(*args, *kwargs.values())  # (the schemas have no keyword-only arguments)
        return redispatch(keyset & _BELOW_BACKEND_SELECT, *args, **kwargs)
    return kernel
