"""One benchmark case: this package and its peers timed on the same inputs,
and this package's outputs checked against float64."""
from __future__ import annotations

import time
from typing import Callable, Optional

import torch

from ...likelihood.log_lik import log_lik, log_lik_components, reference_log_lik
from . import peers
from .cases import F32, Shape, l2_bytes, make_counts, make_log_alpha, rotation, rotation_copies
from .timing import Timer


def median(result: Optional[dict]) -> Optional[float]:
    return None if result is None else result["median_us"]


def err_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref|, in float64."""
    scale = ref.abs().max().item()
    return (x.double().cpu() - ref.cpu()).abs().max().item() / max(scale, 1e-300)


def free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def bench_case(label: str, counts: torch.Tensor, log_alpha: torch.Tensor, timer: Timer,
               bw: float, *, do_compile: bool, compile_dynamic: bool, device: torch.device,
               log: Callable[[str], None],
               numpyro: Optional[peers.NumPyroPeer] = None) -> dict:
    """One row of the table: this package, eager, torch.compile and NumPyro,
    forward and forward+backward; the floor; errors against float64."""
    B, V = counts.shape
    la = log_alpha
    la_g = la.detach().clone().requires_grad_(True)
    fwd_bytes, fb_bytes = peers.floor_bytes(counts.numel() * counts.element_size(),
                                            la.numel(), B)
    row = {
        "name": label, "B": B, "V": V,
        "nonzero_fraction": (counts != 0).float().mean().item(),
        "floor_fwd_bytes": fwd_bytes, "floor_fwdbwd_bytes": fb_bytes,
        "floor_fwd_us": fwd_bytes / bw * 1e6, "floor_fwdbwd_us": fb_bytes / bw * 1e6,
        "times": {}, "compile_error": None, "compile_warmup_s": {}, "numpyro_error": None,
    }
    t = row["times"]

    # Checked against float64 first (this also warms the ops up).
    with torch.no_grad():
        ref = reference_log_lik(counts.double(), la.double())
        row["err_fwd"] = rel_err(log_lik(counts, la), ref)
        row["err_eager_fwd"] = rel_err(peers.eager(counts, la), ref)
        del ref
    la64 = la.double().requires_grad_(True)
    gref = peers.grad_of(reference_log_lik, counts.double(), la64)
    row["err_grad"] = rel_err(peers.grad_of(log_lik, counts, la_g), gref)
    del gref, la64
    free(device)

    nxt = rotation(counts, l2_bytes(device))
    log(f"  {label}: ext")
    t["ext_fwd"] = timer(lambda: log_lik(nxt(), la))
    t["ext_fwdbwd"] = timer(lambda: peers.grad_of(log_lik, nxt(), la_g))
    log(f"  {label}: eager")
    t["eager_fwd"] = timer(lambda: peers.eager(nxt(), la))
    t["eager_fwdbwd"] = timer(lambda: peers.grad_of(peers.eager, nxt(), la_g))
    free(device)

    t["compile_fwd"] = t["compile_fwdbwd"] = None
    if do_compile:
        log(f"  {label}: torch.compile")
        _time_compiled(row, counts, la, la_g, nxt, timer, compile_dynamic, log)
    del nxt
    free(device)

    t["numpyro_fwd"] = t["numpyro_fwdbwd"] = None
    if numpyro is not None:
        log(f"  {label}: numpyro")
        try:
            copies = rotation_copies(counts, l2_bytes(device))
            fwd, fwdbwd, first = numpyro.calls(copies, la)
            del copies
            ref = reference_log_lik(counts.double(), la.double(), True)
            row["err_numpyro_fwd"] = rel_err(first, ref)
            del ref
            res = timer.host_paired({"fwd": fwd})
            res.update(timer.host_paired({"fwdbwd": fwdbwd}))
            t["numpyro_fwd"], t["numpyro_fwdbwd"] = res["fwd"], res["fwdbwd"]
            del fwd, fwdbwd
        except Exception as e:  # noqa: BLE001 - a peer's failure is n/a, not the run's
            row["numpyro_error"] = err_text(e)
            log(f"  {label}: numpyro failed: {err_text(e)}")
        free(device)

    ext_f, ext_fb = median(t["ext_fwd"]), median(t["ext_fwdbwd"])
    row["ratio_fwd_floor"] = ext_f / row["floor_fwd_us"]
    row["ratio_fwdbwd_floor"] = ext_fb / row["floor_fwdbwd_us"]
    row["speedup_fwd_vs_eager"] = median(t["eager_fwd"]) / ext_f
    row["speedup_fwdbwd_vs_eager"] = median(t["eager_fwdbwd"]) / ext_fb
    return row


def _time_compiled(row, counts, la, la_g, nxt, timer, compile_dynamic, log) -> None:
    t = row["times"]
    label = row["name"]
    if not compile_dynamic:
        # A fresh compile per shape: every shape gets a static-shape graph
        # (no automatic-dynamic recompile, no recompile limit).
        peers.compiler_reset()
    try:
        compiled = peers.compiled_reference(compile_dynamic)
    except Exception as e:  # noqa: BLE001 - any compile failure is n/a
        row["compile_error"] = err_text(e)
        return
    cases = {
        "compile_fwd": lambda: compiled(nxt(), la),
        "compile_fwdbwd": lambda: peers.grad_of(compiled, nxt(), la_g),
    }
    for key, fn in cases.items():
        try:
            t0 = time.perf_counter()
            fn()  # compiles: warm-up, not timed
            fn()
            timer.sync()
            row["compile_warmup_s"][key] = time.perf_counter() - t0
            t[key] = timer(fn)
        except Exception as e:  # noqa: BLE001
            row["compile_error"] = (row["compile_error"] or "") + f"[{key}] {err_text(e)} "
            log(f"  {label}: {key} failed: {err_text(e)}")
    if row["compile_error"] is None and t["compile_fwd"] is not None:
        try:  # (not under no_grad: that would be a guard miss and a recompile)
            ref = reference_log_lik(counts.double(), la.double())
            row["err_compile_fwd"] = rel_err(compiled(counts, la), ref)
        except Exception:  # noqa: BLE001 - the error column stays n/a
            pass


def bench_small(counts: torch.Tensor, log_alpha: torch.Tensor, timer: Timer,
                device: torch.device) -> dict:
    """The small-problem peers, ``counts.add(1)`` and a trivial gradient
    ``autograd.grad((counts * la).sum(), la)``, timed interleaved with this
    package's forward and forward+backward (Timer.paired): host time
    dominates all four, and it drifts between separate timing loops."""
    la_g = log_alpha.detach().clone().requires_grad_(True)
    nxt = rotation(counts, l2_bytes(device))
    res = timer.paired({
        "add1": lambda: nxt().add(1),
        "ext_fwd": lambda: log_lik(nxt(), log_alpha),
        "trivial_grad": lambda: torch.autograd.grad((nxt() * la_g).sum(), la_g),
        "ext_fwdbwd": lambda: peers.grad_of(log_lik, nxt(), la_g),
    })
    return {"B": counts.shape[0], "V": counts.shape[1], **res}


def bench_components(B: int, V: int, K: int, g: torch.Generator, device: torch.device,
                     timer: Timer, bw: float, log: Callable[[str], None]) -> dict:
    """``log_lik_components`` with K components against K separate
    ``log_lik`` calls stacked, forward and forward+backward."""
    counts = make_counts(Shape("components", B, V), g, device)
    la = make_log_alpha((K, V), g, device)
    la_g = la.detach().clone().requires_grad_(True)
    fwd_bytes, fb_bytes = peers.floor_bytes(counts.numel() * F32, K * V, B * K)
    res = {"B": B, "V": V, "K": K, "floor_fwd_us": fwd_bytes / bw * 1e6,
           "floor_fwdbwd_us": fb_bytes / bw * 1e6, "times": {}}

    def separate(c, a):
        return torch.stack([log_lik(c, a[k]) for k in range(K)], dim=1)

    with torch.no_grad():
        out = log_lik_components(counts, la)
        c64 = counts.double()
        ref = torch.stack([reference_log_lik(c64, la[k].double()) for k in range(K)], dim=1)
        res["err_fwd"] = rel_err(out, ref)
        res["err_fwd_separate"] = rel_err(separate(counts, la), ref)
        del out, ref, c64
    g_fused = peers.grad_of(log_lik_components, counts, la_g)
    g_sep = peers.grad_of(separate, counts, la_g)
    res["grad_diff_fused_vs_separate"] = rel_err(g_fused, g_sep.double())
    del g_fused, g_sep
    t = res["times"]
    nxt = rotation(counts, l2_bytes(device))
    log(f"  components K={K}: fused")
    t["fused_fwd"] = timer(lambda: log_lik_components(nxt(), la))
    t["fused_fwdbwd"] = timer(lambda: peers.grad_of(log_lik_components, nxt(), la_g))
    log(f"  components K={K}: {K} separate log_lik calls")
    t["separate_fwd"] = timer(lambda: separate(nxt(), la))
    t["separate_fwdbwd"] = timer(lambda: peers.grad_of(separate, nxt(), la_g))
    del nxt
    res["ratio_fwd_floor"] = median(t["fused_fwd"]) / res["floor_fwd_us"]
    res["ratio_fwdbwd_floor"] = median(t["fused_fwdbwd"]) / res["floor_fwdbwd_us"]
    res["speedup_fwd_vs_separate"] = median(t["separate_fwd"]) / median(t["fused_fwd"])
    res["speedup_fwdbwd_vs_separate"] = median(t["separate_fwdbwd"]) / median(t["fused_fwdbwd"])
    free(device)
    return res
