"""The DM regression case (``--regression``): the ``log_lik_regression`` op
(fused on the CPU; on CUDA the same composition as the next, inside one
op) against ``X @ W + bias`` then this package's per-sample ``log_lik``
written by the user, and the eager float32 reference on the same
``log_alpha``, forward and forward+backward (the gradients of the summed
log-likelihood with respect to X, W and bias). The floor: the bytes of
counts and X read once (W, bias and the output are small beside them; the
gradients add dX written and the incoming gradient)."""
from __future__ import annotations

from typing import Callable

import torch

from ...likelihood.log_lik import log_lik, reference_log_lik
from ...likelihood.regression import log_lik_regression
from .cases import F32, Shape, l2_bytes, make_counts, rotation
from .measure import free, median, rel_err
from .timing import Timer

# (B, V) of the case by run kind; P is --regression's value.
REGRESSION_SHAPE = {"cuda": (65536, 1024), "cpu": (4096, 1024), "quick": (128, 64)}


def regression_floor_bytes(B: int, V: int, P: int):
    """(forward, forward+backward) bytes that must move: counts and X read,
    W and bias read, the output written; for forward+backward also the
    incoming gradient read and dX, dW, dbias written."""
    fwd = B * V * F32 + B * P * F32 + (P + 1) * V * F32 + B * F32
    return fwd, fwd + B * F32 + B * P * F32 + (P + 1) * V * F32


def _unfused(counts, X, W, b):
    return log_lik(counts, X @ W + b)


def _eager(counts, X, W, b):
    return reference_log_lik(counts, X @ W + b)


def _op(counts, X, W, b):
    return log_lik_regression(counts, X, W, b)


def _grads(f: Callable, counts, X, W, b):
    return torch.autograd.grad(f(counts, X, W, b).sum(), (X, W, b))


def bench_regression(B: int, V: int, P: int, g: torch.Generator, device: torch.device,
                     timer: Timer, bw: float, log: Callable[[str], None]) -> dict:
    counts = make_counts(Shape("regression", B, V), g, device)
    # log_alpha = X W + bias within about U(-2, 3), the other cases' range.
    X = torch.randn((B, P), generator=g, device=device)
    W = torch.randn((P, V), generator=g, device=device) * (0.8 / P ** 0.5)
    b = torch.empty(V, device=device).uniform_(-0.5, 1.5, generator=g)
    leaves = [t.detach().clone().requires_grad_(True) for t in (X, W, b)]
    fwd_bytes, fb_bytes = regression_floor_bytes(B, V, P)
    res = {"B": B, "V": V, "P": P, "floor_fwd_us": fwd_bytes / bw * 1e6,
           "floor_fwdbwd_us": fb_bytes / bw * 1e6, "times": {}}

    with torch.no_grad():
        ref = reference_log_lik(counts.double(), X.double() @ W.double() + b.double())
        res["err_fwd"] = rel_err(_op(counts, X, W, b), ref)
        res["err_fwd_unfused"] = rel_err(_unfused(counts, X, W, b), ref)
        del ref
    ref_leaves = [t.detach().double().requires_grad_(True) for t in (X, W, b)]
    ref_grads = torch.autograd.grad(
        reference_log_lik(counts.double(), ref_leaves[0] @ ref_leaves[1] + ref_leaves[2]).sum(),
        ref_leaves)
    got = _grads(_op, counts, *leaves)
    res["err_grad"] = max(rel_err(x, r) for x, r in zip(got, ref_grads))
    del ref_leaves, ref_grads, got
    free(device)

    t = res["times"]
    nxt = rotation(counts, l2_bytes(device))
    for name, f in (("op", _op), ("unfused", _unfused), ("eager", _eager)):
        log(f"  regression P={P}: {name}")
        t[f"{name}_fwd"] = timer(lambda f=f: f(nxt(), X, W, b))
        t[f"{name}_fwdbwd"] = timer(lambda f=f: _grads(f, nxt(), *leaves))
    del nxt
    res["ratio_fwd_floor"] = median(t["op_fwd"]) / res["floor_fwd_us"]
    res["ratio_fwdbwd_floor"] = median(t["op_fwdbwd"]) / res["floor_fwdbwd_us"]
    for peer in ("unfused", "eager"):
        res[f"speedup_fwd_vs_{peer}"] = median(t[f"{peer}_fwd"]) / median(t["op_fwd"])
        res[f"speedup_fwdbwd_vs_{peer}"] = median(t[f"{peer}_fwdbwd"]) / median(t["op_fwdbwd"])
    free(device)
    return res


def regression_table(reg: dict, markdown: bool) -> str:
    """One line: the op, the unfused way and the eager reference,
    forward and forward+backward, against the floor."""
    t = reg["times"]
    cols = ["case", "floor", "op", "unfused", "eager", "x floor", "err"]
    fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
    lines = []
    for kind, floor in (("fwd", reg["floor_fwd_us"]), ("fwdbwd", reg["floor_fwdbwd_us"])):
        lines.append([f"regression {reg['B']}x{reg['V']}, P={reg['P']} {kind}", fmt(floor),
                      fmt(median(t[f"op_{kind}"])), fmt(median(t[f"unfused_{kind}"])),
                      fmt(median(t[f"eager_{kind}"])), f"{reg[f'ratio_{kind}_floor']:.2f}",
                      f"{reg['err_fwd' if kind == 'fwd' else 'err_grad']:.1e}"])
    if markdown:
        out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(r) + " |" for r in lines]
        return "\n".join(out)
    widths = [max(len(c), *(len(r[i]) for r in lines)) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    out += ["  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in lines]
    return "\n".join(out)
