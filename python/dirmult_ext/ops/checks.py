"""The argument checks of the dirmult functions and ops, each message written
once.

Two tiers:

* the Python API's (``likelihood/``): ``TypeError``/``ValueError`` that name the
  argument and what was expected, before any op is called;
* the ops' (``OP_CHECKS``, one entry per op): ``RuntimeError``, the same checks and messages as
  ``src/common/tensor_checks.h``, run before the kernels where a C++ error
  would not reach Python (see Note [Stable ABI errors]).

Every check reads only tensor metadata: none reads the device.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

COUNT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                torch.int32, torch.int64, torch.uint8)
COMPUTE_DTYPES = (torch.float32, torch.float64)
REDUCTIONS = ("none", "sum", "mean")


# ------------------------------------------------------------- the Python API
def inputs(counts, log_alpha, name: str = "log_alpha") -> None:
    """counts and the concentration argument ``name``: tensors, dtypes,
    layout, rank, device."""
    if not isinstance(counts, Tensor):
        raise TypeError(f"counts must be a torch.Tensor, got {type(counts).__name__}")
    if not isinstance(log_alpha, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(log_alpha).__name__}")
    if counts.dtype not in COUNT_DTYPES:
        raise ValueError(
            f"counts must have dtype float32, float64, float16, bfloat16, int32, int64 "
            f"or uint8, got {counts.dtype}")
    if not log_alpha.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {log_alpha.dtype}")
    if counts.layout != torch.strided:
        raise ValueError(f"counts must be a dense (strided) tensor, got {counts.layout}")
    if log_alpha.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got {log_alpha.layout}")
    if counts.dim() < 1:
        raise ValueError("counts must have shape (..., V) with at least one dimension, "
                         "got a 0-d tensor")
    if counts.device != log_alpha.device:
        raise ValueError(f"counts and {name} must be on the same device, got "
                         f"{counts.device} and {log_alpha.device}")


def log_lik_shapes(counts: Tensor, log_alpha: Tensor, name: str) -> None:
    """log_alpha (V,) shared by all rows, or counts' shape (per-sample)."""
    V = counts.shape[-1]
    # Compare dims before sizes: under torch.compile/export a size comparison
    # becomes a guard, and the batch size must stay free.
    shared = log_alpha.dim() == 1 and log_alpha.shape[0] == V
    if not shared and (log_alpha.dim() != counts.dim() or log_alpha.shape != counts.shape):
        raise ValueError(
            f"{name} must have shape ({V},) (shared) or counts' shape {tuple(counts.shape)} "
            f"(per-sample), got {tuple(log_alpha.shape)}")


def components_shapes(counts: Tensor, log_alpha: Tensor) -> None:
    """counts (B, V), log_alpha (K, V)."""
    if counts.dim() != 2:
        raise ValueError(f"counts must be (B, V), got shape {tuple(counts.shape)}")
    if log_alpha.dim() != 2 or log_alpha.shape[1] != counts.shape[1]:
        raise ValueError(f"log_alpha must be (K, {counts.shape[1]}), got "
                         f"{tuple(log_alpha.shape)}")


def finite(counts: Tensor, log_alpha: Tensor, name: str) -> None:
    """Counts finite and non-negative, concentrations finite. Synchronizes
    with the device: only when the caller asks for validation."""
    if counts.is_floating_point() and not bool(torch.isfinite(counts).all()):
        raise ValueError("counts contains NaN or infinite values")
    if bool((counts < 0).any()):
        raise ValueError("counts contains negative values")
    if not bool(torch.isfinite(log_alpha).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


def positive(alpha: Tensor, name: str = "alpha") -> None:
    """Concentrations given as alpha: finite and > 0 (checked before the
    log, where a negative alpha would read as a NaN)."""
    if not bool(torch.isfinite(alpha).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    if bool((alpha <= 0).any()):
        raise ValueError(f"{name} must be positive, got {float(alpha.min())}")


def regression_inputs(counts, X, W, bias) -> None:
    """log_lik_regression's arguments: counts (B, V), X (B, P), W (P, V),
    bias (V,) or None; tensors, dense, floating design, one device."""
    for t, name in ((counts, "counts"), (X, "X"), (W, "W")):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if counts.layout != torch.strided:
        raise ValueError(f"log_lik_regression takes dense (strided) counts only, got "
                         f"{counts.layout}; densify sparse counts with .to_dense()")
    if counts.dtype not in COUNT_DTYPES:
        raise ValueError(
            f"counts must have dtype float32, float64, float16, bfloat16, int32, int64 "
            f"or uint8, got {counts.dtype}")
    named = [(X, "X"), (W, "W")] + ([(bias, "bias")] if bias is not None else [])
    for t, name in named:
        if t.layout != torch.strided:
            raise ValueError(f"{name} must be a dense (strided) tensor, got {t.layout}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.device != counts.device:
            raise ValueError(f"counts and {name} must be on the same device, got "
                             f"{counts.device} and {t.device}")
    if counts.dim() != 2:
        raise ValueError(f"counts must have shape (B, V), got {tuple(counts.shape)}")
    if X.dim() != 2:
        raise ValueError(f"X must have shape (B, P), got {tuple(X.shape)}")
    if W.dim() != 2:
        raise ValueError(f"W must have shape (P, V), got {tuple(W.shape)}")
    B, V = counts.shape
    if X.shape[0] != B:
        raise ValueError(f"X must have one row per row of counts (B={B}), got shape "
                         f"{tuple(X.shape)}")
    if W.shape[0] != X.shape[1]:
        raise ValueError(f"W must have one row per column of X (P={X.shape[1]}), got shape "
                         f"{tuple(W.shape)}")
    if W.shape[1] != V:
        raise ValueError(f"W must have one column per category of counts (V={V}), got "
                         f"shape {tuple(W.shape)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != V):
        raise ValueError(f"bias must have shape ({V},), got {tuple(bias.shape)}")


def reduction(value: str) -> None:
    if value not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, REDUCTIONS))}, "
                         f"got {value!r}")


# ------------------------------------------- the ops (src/common/tensor_checks.h)
def _fail(message: str):
    raise RuntimeError("dirmult: " + message)


def _dense(t: Tensor, name: str) -> None:
    if t.layout != torch.strided:
        _fail(f"{name} must be a dense (strided) tensor, got {t.layout}")


def _same_device(a: Tensor, a_name: str, b: Tensor, b_name: str) -> None:
    if a.device != b.device:
        _fail(f"{a_name} and {b_name} must be on the same device")


def _counts(counts: Tensor) -> None:
    _dense(counts, "counts")
    if counts.dim() < 1:
        _fail("counts must have at least 1 dimension (..., V), got a 0-d tensor")
    if counts.dtype not in COUNT_DTYPES:
        _fail("counts must be float32, float64, float16, bfloat16, int32, int64 or uint8")


def _log_lik(counts: Tensor, log_alpha: Tensor, *_) -> bool:
    """check_log_alpha: True when log_alpha is shared by all rows."""
    _counts(counts)
    _dense(log_alpha, "log_alpha")
    if log_alpha.dtype not in COMPUTE_DTYPES:
        _fail("log_alpha must be float32 or float64 (it sets the compute dtype)")
    _same_device(counts, "counts", log_alpha, "log_alpha")
    V = counts.shape[-1]
    if log_alpha.dim() == 1 and counts.dim() != 1:
        if log_alpha.shape[0] != V:
            _fail(f"log_alpha has {log_alpha.shape[0]} categories but counts has V={V}")
        return True
    if log_alpha.dim() != counts.dim():
        _fail("log_alpha must be (V,) or have counts' shape")
    for d in range(counts.dim()):
        if log_alpha.shape[d] != counts.shape[d]:
            _fail(f"log_alpha must be (V,) or have counts' shape; mismatch at dim {d}: "
                  f"{log_alpha.shape[d]} vs {counts.shape[d]}")
    return counts.dim() == 1


def _components(counts: Tensor, log_alpha: Tensor, *_) -> None:
    _counts(counts)
    _dense(log_alpha, "log_alpha")
    if counts.dim() != 2:
        _fail("counts must be (B, V) for log_lik_components")
    if log_alpha.dim() != 2:
        _fail("log_alpha must be (K, V) for log_lik_components")
    if log_alpha.dtype not in COMPUTE_DTYPES:
        _fail("log_alpha must be float32 or float64")
    if log_alpha.shape[1] != counts.shape[1]:
        _fail(f"log_alpha has {log_alpha.shape[1]} categories but counts has "
              f"V={counts.shape[1]}")
    _same_device(counts, "counts", log_alpha, "log_alpha")


def _grad(grad: Tensor, counts: Tensor, log_alpha: Tensor) -> None:
    _dense(grad, "grad")
    _same_device(grad, "grad", counts, "counts")
    if grad.dtype != log_alpha.dtype:
        _fail("grad must have log_alpha's dtype")


# The checks of the ops with more than their family's: each takes the op's
# arguments (trailing defaults may be left out).
def op_log_lik_with_grad(counts, log_alpha, *_):
    if not _log_lik(counts, log_alpha):
        _fail("log_lik_with_grad takes log_alpha of shape (V,), shared by all rows; "
              "per-sample log_alpha of counts' shape has no single-pass gradient")


def op_log_lik_backward(grad, counts, log_alpha, *_):
    _log_lik(counts, log_alpha)
    _grad(grad, counts, log_alpha)
    if grad.numel() != _batch_numel(counts):
        _fail("grad must have counts' batch shape")


def _batch_numel(counts: Tensor) -> int:
    n = 1
    for size in counts.shape[:-1]:
        n *= size
    return n


def op_log_lik_components_backward(grad, counts, log_alpha, *_):
    _components(counts, log_alpha)
    _dense(grad, "grad")
    _same_device(grad, "grad", counts, "counts")
    if grad.dim() != 2 or grad.shape[0] != counts.shape[0] or grad.shape[1] != log_alpha.shape[0]:
        _fail("grad must be (B, K)")
    if grad.dtype != log_alpha.dtype:
        _fail("grad must have log_alpha's dtype")


def _elementwise_terms(op, log_alpha, n, *_):
    _dense(log_alpha, "log_alpha")
    _dense(n, "n")
    if log_alpha.dtype not in COMPUTE_DTYPES or n.dtype != log_alpha.dtype:
        _fail(f"{op} takes float32/float64 log_alpha and n of one dtype")
    if log_alpha.numel() != n.numel():
        _fail(f"{op} needs log_alpha and n of one size")
    _same_device(log_alpha, "log_alpha", n, "n")


def _csr_parts(crow, col, values, log_alpha, *_) -> None:
    for t, name in ((crow, "crow_indices"), (col, "col_indices"), (values, "values"),
                    (log_alpha, "log_alpha")):
        _dense(t, name)
    if crow.dim() != 1 or col.dim() != 1 or values.dim() != 1:
        _fail("crow_indices, col_indices and values must be 1-d")
    if crow.numel() < 1:
        _fail("crow_indices must have B + 1 >= 1 entries")
    if crow.dtype not in (torch.int32, torch.int64) or col.dtype != crow.dtype:
        _fail("crow_indices and col_indices must both be int32 or both int64")
    if values.dtype not in COMPUTE_DTYPES:
        _fail("values must be float32 or float64")
    if col.numel() != values.numel():
        _fail("col_indices and values must have the same length")
    if log_alpha.dtype not in COMPUTE_DTYPES:
        _fail("log_alpha must be float32 or float64")
    if log_alpha.dim() not in (1, 2):
        _fail("log_alpha must be (V,) or (K, V) with CSR counts")
    _same_device(crow, "crow_indices", col, "col_indices")
    _same_device(crow, "crow_indices", values, "values")
    _same_device(crow, "crow_indices", log_alpha, "log_alpha")
    if log_alpha.is_cuda and log_alpha.dim() == 2 and log_alpha.shape[0] > 65535:
        _fail("at most 65535 components with CSR counts on CUDA")


def op_log_lik_csr_with_grad(crow, col, values, log_alpha, *_):
    _csr_parts(crow, col, values, log_alpha)
    if log_alpha.dim() != 1:
        _fail("log_lik_csr_with_grad takes log_alpha of shape (V,), shared by all rows; "
              f"got {tuple(log_alpha.shape)}")


def op_log_lik_csr_backward(grad, crow, values, csc_ptr, csc_rows, csc_values, log_alpha):
    _csr_parts(crow, csc_rows, values, log_alpha)
    for t, name in ((grad, "grad"), (csc_ptr, "csc_ptr"), (csc_values, "csc_values")):
        _dense(t, name)
    B, V = crow.numel() - 1, log_alpha.shape[-1]
    if csc_ptr.dim() != 1 or csc_ptr.numel() != V + 1 or csc_ptr.dtype != crow.dtype:
        _fail("csc_ptr must be (V + 1,) of crow_indices' dtype")
    if (csc_values.dim() != 1 or csc_values.numel() != values.numel()
            or csc_values.dtype != values.dtype):
        _fail("csc_values must be values' length and dtype")
    if grad.dtype != log_alpha.dtype:
        _fail("grad must have log_alpha's dtype")
    if log_alpha.dim() == 1:
        ok = grad.dim() == 1 and grad.shape[0] == B
    else:
        ok = grad.dim() == 2 and grad.shape[0] == B and grad.shape[1] == log_alpha.shape[0]
    if not ok:
        _fail("grad must be (B,) for (V,) log_alpha, (B, K) for (K, V)")
    _same_device(crow, "crow_indices", grad, "grad")
    _same_device(crow, "crow_indices", csc_ptr, "csc_ptr")
    _same_device(crow, "crow_indices", csc_values, "csc_values")


def _regression(counts, X, W, bias=None, *_) -> None:
    """check_regression."""
    _counts(counts)
    if counts.dim() != 2:
        _fail(f"counts must be (B, V) for log_lik_regression, got {counts.dim()} dimensions")
    _dense(X, "X")
    _dense(W, "W")
    if X.dim() != 2:
        _fail(f"X must be (B, P) for log_lik_regression, got {X.dim()} dimensions")
    if W.dim() != 2:
        _fail(f"W must be (P, V) for log_lik_regression, got {W.dim()} dimensions")
    if X.dtype not in COMPUTE_DTYPES:
        _fail("X must be float32 or float64 (it sets the compute dtype)")
    if W.dtype != X.dtype:
        _fail("W must have X's dtype")
    if X.shape[0] != counts.shape[0]:
        _fail(f"X has {X.shape[0]} rows but counts has B={counts.shape[0]}")
    if W.shape[0] != X.shape[1]:
        _fail(f"W has {W.shape[0]} rows but X has P={X.shape[1]} columns")
    if W.shape[1] != counts.shape[1]:
        _fail(f"W has {W.shape[1]} columns but counts has V={counts.shape[1]}")
    _same_device(counts, "counts", X, "X")
    _same_device(counts, "counts", W, "W")
    if bias is not None:
        _dense(bias, "bias")
        if bias.dim() != 1 or bias.shape[0] != counts.shape[1]:
            _fail(f"bias must be (V,) with V={counts.shape[1]}")
        if bias.dtype != X.dtype:
            _fail("bias must have X's dtype")
        _same_device(counts, "counts", bias, "bias")


def op_log_lik_regression_backward(grad, counts, X, W, bias=None, *_):
    _regression(counts, X, W, bias)
    _dense(grad, "grad")
    _same_device(grad, "grad", counts, "counts")
    if grad.dtype != X.dtype:
        _fail("grad must have X's dtype")
    if grad.dim() != 1 or grad.shape[0] != counts.shape[0]:
        _fail(f"grad must be (B,) with B={counts.shape[0]}")


# One entry per op: its family's check, or the op's own above. A new op of an
# existing family adds one line here.
OP_CHECKS = {
    "log_lik": _log_lik,
    "log_lik_backward": op_log_lik_backward,
    "log_lik_with_grad": op_log_lik_with_grad,
    "log_lik_components": _components,
    "log_lik_components_backward": op_log_lik_components_backward,
    "poch_terms": functools.partial(_elementwise_terms, "poch_terms"),
    "tpoch_terms": functools.partial(_elementwise_terms, "tpoch_terms"),
    "log_lik_csr": _csr_parts,
    "log_lik_csr_backward": op_log_lik_csr_backward,
    "log_lik_csr_with_grad": op_log_lik_csr_with_grad,
    "log_lik_regression": _regression,
    "log_lik_regression_backward": op_log_lik_regression_backward,
}
