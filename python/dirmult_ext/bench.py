"""``dirmult-ext bench``: time the dirmult ops against their peers.

    dirmult-ext bench [--device cpu|cuda[:i]] [--shapes NAME[=BxV[:DENSITY]] ...]
                      [--per-sample] [--components [K]] [--quick] [--no-compile]
                      [--json [PATH]] [--markdown] [--seed N]

(also ``python -m dirmult_ext.bench``). For each shape (DESIGN.md section 4:
float32 counts, one log_alpha shared by all rows) it times, on one device:

* ``dirmult_ext.log_lik`` forward, and forward+backward
  (``torch.autograd.grad(log_lik(counts, la).sum(), la)``);
* the eager float32 reference ``dirmult_ext.reference_log_lik``, the same two ways;
* the same reference under ``torch.compile`` (default mode; a compile error
  is reported as n/a, it does not stop the run);
* the floor: the bytes that must move (counts read once, log_alpha, the
  output; for forward+backward also the incoming gradient and the gradient
  written), divided by the copy bandwidth measured in this run.

It also times ``counts.add(1)`` and a trivial gradient
(``autograd.grad((counts * la).sum(), la)``) at the seed shape, interleaved
call by call with this package's forward and forward+backward there (the
small-problem targets compare those four), checks the
forward (and the gradient) against the float64 reference on every shape, and
prints whether the performance targets of issue 3 are met.

Timing: warm-up calls first (for torch.compile, the compiling calls are
warm-up too and are not timed), then timed calls until both a minimum number
of calls and a minimum time are reached; the MEDIAN per call is reported, in
microseconds. On CUDA each call is bracketed by its own CUDA events; with
--timing queued (the default) calls follow each other without a synchronize,
as in a training loop (and triton.testing.do_bench), so a call's time is its
GPU time where the GPU is the bottleneck and its host time (Python, dispatch,
launches, the autograd engine) where the host is; --timing synced adds a
synchronize after every call (the latency of one isolated call: host + GPU +
launch latency); --timing graph replays the calls from a CUDA graph (the GPU
time per call with no host in the way: what the kernels take, below what an
eager call costs where the host is the bottleneck). Counts that fit in L2
are rotated among copies. On CPU,
time.perf_counter around each call; the torch thread count is left as it is.

Data is fresh each run (a torch.Generator seeded from the clock; the seed is
printed and written to the JSON; --seed repeats a run).
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import re
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from . import (CUDA_KERNELS, __version__, build_info, log_lik, log_lik_components,
               reference_log_lik)

F32 = 4  # bytes per float32 element


# ----------------------------------------------------------------------- shapes
@dataclass
class Shape:
    name: str
    B: int
    V: int
    density: Optional[float] = None  # None: integers 0..9; else that fraction nonzero, 1+Poisson(3)

    @property
    def bxv(self) -> str:
        s = f"{self.B}x{self.V}"
        return s if self.density is None else f"{s}:{self.density:g}"


SPARSE_DENSITY = 0.01

# DESIGN.md section 4.
CUDA_SHAPES = [Shape("seed", 512, 256), Shape("mid", 8192, 1024), Shape("tall", 65536, 1024),
               Shape("wide", 64, 262144), Shape("sparse", 16384, 16384, SPARSE_DENSITY)]
# Two cores: seed and mid as on the GPU (the CPU target is at mid); tall,
# wide and sparse scaled down (same kind of data; tall stays tall, wide keeps
# V = 262144) so the whole CPU run takes a minute or two on 2 idle cores.
CPU_SHAPES = [Shape("seed", 512, 256), Shape("mid", 8192, 1024), Shape("tall", 16384, 256),
              Shape("wide", 8, 262144), Shape("sparse", 2048, 4096, SPARSE_DENSITY)]
QUICK_SHAPES = [Shape("seed", 128, 64), Shape("mid", 256, 128), Shape("tall", 1024, 32),
                Shape("wide", 4, 4096), Shape("sparse", 256, 512, 0.05)]
COMPONENTS_SHAPE = {"cuda": (65536, 1024), "cpu": (4096, 1024), "quick": (128, 64)}

_SHAPE_RE = re.compile(r"^(?P<name>[A-Za-z_][\w\-]*)(=(?P<B>\d+)x(?P<V>\d+)(:(?P<d>[0-9.eE\-]+))?)?$")


def parse_shapes(specs: List[str], defaults: List[Shape]) -> List[Shape]:
    """``name`` selects a default shape; ``name=BxV[:density]`` overrides or adds one."""
    by_name = {s.name: s for s in defaults}
    out: List[Shape] = []
    for spec in (x for item in specs for x in item.split(",") if x):
        m = _SHAPE_RE.match(spec.strip())
        if not m:
            raise ValueError(f"bad --shapes entry {spec!r}; use name or name=BxV[:density]")
        name = m["name"]
        if m["B"] is None:
            if name not in by_name:
                raise ValueError(f"unknown shape {name!r}; defaults are {', '.join(by_name)}")
            shape = by_name[name]
        else:
            density = float(m["d"]) if m["d"] else (SPARSE_DENSITY if name == "sparse" else None)
            if density is not None and not 0.0 < density <= 1.0:
                raise ValueError(f"density must be in (0, 1], got {density} in {spec!r}")
            shape = Shape(name, int(m["B"]), int(m["V"]), density)
            if shape.B < 1 or shape.V < 1:
                raise ValueError(f"empty shape in {spec!r}")
        out = [s for s in out if s.name != name] + [shape]
    return out


def _parse_bxv(text: str):
    m = re.match(r"^(\d+)x(\d+)$", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected BxV, got {text!r}")
    return int(m[1]), int(m[2])


# ------------------------------------------------------------------------- data
def make_counts(shape: Shape, g: torch.Generator, device: torch.device) -> torch.Tensor:
    B, V = shape.B, shape.V
    if shape.density is None:
        counts = torch.randint(0, 10, (B, V), generator=g, device=device, dtype=torch.float32)
    else:
        mask = torch.rand((B, V), generator=g, device=device) < shape.density
        nnz = int(mask.sum())
        vals = 1.0 + torch.poisson(torch.full((nnz,), 3.0, device=device), generator=g)
        counts = torch.zeros((B, V), device=device, dtype=torch.float32)
        counts.masked_scatter_(mask, vals)
        del mask, vals
    if not bool(counts.any()):  # never all zeros (a kernel could skip everything)
        counts[0, 0] = 1.0
    return counts


def make_log_alpha(shape, g: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, device=device, dtype=torch.float32).uniform_(-2.0, 3.0, generator=g)


# ----------------------------------------------------------------------- timing
class Timer:
    """Median per-call time in microseconds, after warm-up.

    CUDA, ``queued`` (the default): each call is bracketed by its own pair of
    CUDA events and calls follow each other without a synchronization (one
    per round of ``ROUND`` calls; the first call of a round, which starts on
    an idle GPU, is not counted), as in ``triton.testing.do_bench`` and as a
    training loop runs. A call's time is then its GPU time when the GPU is
    the bottleneck, and its host time (Python, dispatch, launches, the
    autograd engine) when the host is: the GPU idles between the start event
    and the first kernel until the host has launched it.
    CUDA, ``synced``: a synchronize after every call, so a call's time is its
    host time plus its GPU time plus the launch latency: the latency of one
    isolated call.
    CUDA, ``graph``: ``GRAPH_CALLS`` calls captured in a CUDA graph (after
    warm-up on a side stream, as capture needs) and the graph replayed, one
    sample per replay (its time over ``GRAPH_CALLS``): the GPU time per call
    with no host in the way, the gaps between a call's kernels included.
    Where the host is the bottleneck this is less than an eager call costs;
    it shows what the kernels take. A function that cannot be captured
    raises.
    CPU: ``time.perf_counter`` around each call.

    Caches: bench_case rotates among copies of the counts (``rotation``), so
    that repeated calls do not read them from L2.
    """

    ROUND = 20
    # Calls per graph: the rotation's largest number of copies, so that a
    # replay reads every copy.
    GRAPH_CALLS = 64

    def __init__(self, device: torch.device, *, warmup: int, min_reps: int, max_reps: int,
                 min_time: float, timing: str = "queued"):
        if timing not in ("queued", "synced", "graph"):
            raise ValueError(f"timing must be 'queued', 'synced' or 'graph', got {timing!r}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.timing = timing if self.cuda else "cpu"
        self.queued = self.timing == "queued"
        self.warmup, self.min_reps, self.max_reps, self.min_time = warmup, min_reps, max_reps, min_time
        self._events: List[torch.cuda.Event] = []

    @property
    def mode(self) -> str:
        return self.timing

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _event_pairs(self, n: int) -> List[torch.cuda.Event]:
        while len(self._events) < 2 * n:
            self._events.append(torch.cuda.Event(enable_timing=True))
        return self._events

    def _round(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, List[float]]:
        """One call of each function per step, in turn; CUDA events on the
        current stream of the current device (set in main)."""
        steps = self.ROUND if self.queued else 1
        out: Dict[str, List[float]] = {name: [] for name in fns}
        if not self.cuda:
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                out[name].append((time.perf_counter() - t0) * 1e6)
            return out
        ev = self._event_pairs(steps * len(fns))
        k = 0
        for _ in range(steps):
            for fn in fns.values():
                ev[2 * k].record()
                fn()
                ev[2 * k + 1].record()
                k += 1
                if not self.queued:
                    ev[2 * k - 1].synchronize()
        self.sync()
        k = 0
        for step in range(steps):
            for name in fns:
                us = ev[2 * k].elapsed_time(ev[2 * k + 1]) * 1e3  # ms -> us
                k += 1
                if step > 0 or steps == 1:
                    out[name].append(us)
        return out

    @staticmethod
    def _summary(times: List[float]) -> Dict[str, float]:
        times = sorted(times)
        n = len(times)
        median = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
        return {"median_us": median, "min_us": times[0], "reps": n}

    def __call__(self, fn: Callable[[], object]) -> Dict[str, float]:
        return self.paired({"fn": fn})["fn"]

    def _capture(self, fn: Callable[[], object]) -> "torch.cuda.CUDAGraph":
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(self.warmup, 3)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.GRAPH_CALLS):
                fn()
        graph.replay()  # the first replay uploads the graph: not timed
        self.sync()
        return graph

    def _paired_graphs(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, Dict[str, float]]:
        graphs = {name: self._capture(fn) for name, fn in fns.items()}
        ev = self._event_pairs(len(graphs))
        times: Dict[str, List[float]] = {name: [] for name in graphs}
        t_begin, calls = time.perf_counter(), 0
        while True:
            for k, g in enumerate(graphs.values()):
                ev[2 * k].record()
                g.replay()
                ev[2 * k + 1].record()
            self.sync()
            for k, name in enumerate(graphs):
                ms = ev[2 * k].elapsed_time(ev[2 * k + 1])
                times[name].append(ms * 1e3 / self.GRAPH_CALLS)
            calls += self.GRAPH_CALLS
            if calls >= self.max_reps or (
                    calls >= self.min_reps
                    and time.perf_counter() - t_begin >= self.min_time * len(fns)):
                break
        del graphs
        return {name: self._summary(t) for name, t in times.items()}

    def paired(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, Dict[str, float]]:
        """Times several functions with their calls interleaved (one call of
        each per step, in turn; with graph timing, one replay of each), so
        that all of them see the same host and GPU conditions: their ratios
        do not drift with the machine's state."""
        if self.timing == "graph":
            return self._paired_graphs(fns)
        for fn in fns.values():
            for _ in range(self.warmup):
                fn()
        self.sync()
        times: Dict[str, List[float]] = {name: [] for name in fns}
        t_begin = time.perf_counter()
        while True:
            for name, ts in self._round(fns).items():
                times[name].extend(ts)
            reps = len(next(iter(times.values())))
            if reps >= self.max_reps or (
                    reps >= self.min_reps
                    and time.perf_counter() - t_begin >= self.min_time * len(fns)):
                break
        return {name: self._summary(t) for name, t in times.items()}


def rotation(counts: torch.Tensor, cache_bytes: int) -> Callable[[], torch.Tensor]:
    """A function returning, call after call, one of enough copies of
    ``counts`` that they do not fit in a cache of ``cache_bytes`` together
    (three times its size; at most 64 copies), so that timed calls read
    device memory as a first call would. Just ``counts`` when one copy is
    already that large or there is no cache to defeat (cache_bytes 0)."""
    nbytes = counts.numel() * counts.element_size()
    copies = 1 if cache_bytes <= 0 or nbytes == 0 else min(64, -(-3 * cache_bytes // nbytes))
    if copies <= 1:
        return lambda: counts
    sets = [counts] + [counts.clone() for _ in range(copies - 1)]
    it = itertools.cycle(sets)
    return it.__next__


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)


def _med(result: Optional[dict]) -> Optional[float]:
    return None if result is None else result["median_us"]


def copy_bandwidth(device: torch.device, timer: Timer, quick: bool) -> dict:
    """Bytes/s of a large ``dst.copy_(src)`` (read + write counted)."""
    if device.type == "cuda":
        nbytes = 2 << 30
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = min(nbytes, int(free * 0.4) // 4096 * 4096)
    else:
        nbytes = 256 << 20
    if quick:
        nbytes = min(nbytes, 32 << 20)
    src = torch.ones(nbytes // F32, device=device, dtype=torch.float32)
    dst = torch.zeros_like(src)  # touched, so the CPU copy does not time page faults
    if timer.mode == "graph":
        # Captured in a CUDA graph, the copy is a memcpy node, which ran at
        # 2773 GB/s on the H200 against 4289 for eager copies (queued): the
        # floor is the eager copy's bandwidth, so it is timed queued.
        timer = Timer(device, warmup=timer.warmup, min_reps=timer.min_reps,
                      max_reps=timer.max_reps, min_time=timer.min_time, timing="queued")
    res = timer(lambda: dst.copy_(src))
    moved = 2 * nbytes
    return {"bytes_copied": nbytes, "bytes_moved": moved, "median_us": res["median_us"],
            "reps": res["reps"], "bytes_per_s": moved / (res["median_us"] * 1e-6),
            "timing": timer.mode}


# --------------------------------------------------------------------- compiling
def _compiler_reset() -> None:
    reset = getattr(getattr(torch, "compiler", None), "reset", None)
    (reset or torch._dynamo.reset)()


def _err_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    return (x.double() - ref).abs().max().item() / max(scale, 1e-300)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------- cases
def bench_case(label: str, counts: torch.Tensor, log_alpha: torch.Tensor, timer: Timer,
               bw: float, *, do_compile: bool, compile_dynamic: bool, device: torch.device,
               log: Callable[[str], None]) -> dict:
    """One row of the table: ext / eager / compile, fwd and fwd+bwd, floor, errors."""
    B, V = counts.shape
    la = log_alpha
    la_g = la.detach().clone().requires_grad_(True)
    out_el = B
    # Floor bytes: counts read once, log_alpha read, output written; for
    # forward+backward also the incoming gradient (B) and grad log_alpha written.
    fwd_bytes = counts.numel() * counts.element_size() + la.numel() * F32 + out_el * F32
    fb_bytes = fwd_bytes + out_el * F32 + la.numel() * F32
    row = {
        "name": label, "B": B, "V": V,
        "nonzero_fraction": (counts != 0).float().mean().item(),
        "floor_fwd_bytes": fwd_bytes, "floor_fwdbwd_bytes": fb_bytes,
        "floor_fwd_us": fwd_bytes / bw * 1e6, "floor_fwdbwd_us": fb_bytes / bw * 1e6,
        "times": {}, "compile_error": None, "compile_warmup_s": {},
    }
    t = row["times"]

    # Sanity check against float64 first (also warms up the ops).
    with torch.no_grad():
        ref = reference_log_lik(counts.double(), la.double())
        row["err_fwd"] = _rel_err(log_lik(counts, la), ref)
        row["err_eager_fwd"] = _rel_err(reference_log_lik(counts, la), ref)
        del ref
    la64 = la.double().requires_grad_(True)
    (gref,) = torch.autograd.grad(reference_log_lik(counts.double(), la64).sum(), la64)
    (gext,) = torch.autograd.grad(log_lik(counts, la_g).sum(), la_g)
    row["err_grad"] = _rel_err(gext, gref)
    del gref, gext, la64
    _free(device)

    nxt = rotation(counts, l2_bytes(device))
    log(f"  {label}: ext")
    t["ext_fwd"] = timer(lambda: log_lik(nxt(), la))
    t["ext_fwdbwd"] = timer(lambda: torch.autograd.grad(log_lik(nxt(), la_g).sum(), la_g))
    log(f"  {label}: eager")
    t["eager_fwd"] = timer(lambda: reference_log_lik(nxt(), la))
    t["eager_fwdbwd"] = timer(
        lambda: torch.autograd.grad(reference_log_lik(nxt(), la_g).sum(), la_g))
    _free(device)

    t["compile_fwd"] = t["compile_fwdbwd"] = None
    if do_compile:
        log(f"  {label}: torch.compile")
        if not compile_dynamic:
            # A fresh compile per shape: every shape gets a static-shape graph
            # (no automatic-dynamic recompile, no recompile limit).
            _compiler_reset()
        try:
            compiled = torch.compile(reference_log_lik, dynamic=True if compile_dynamic else None)
        except Exception as e:  # noqa: BLE001 - any compile failure -> n/a
            row["compile_error"] = _err_text(e)
            compiled = None
        cases = {
            "compile_fwd": lambda: compiled(nxt(), la),
            "compile_fwdbwd": lambda: torch.autograd.grad(compiled(nxt(), la_g).sum(), la_g),
        }
        for key, fn in cases.items():
            if compiled is None:
                break
            try:
                t0 = time.perf_counter()
                fn()  # compiles: warm-up, not timed
                fn()
                timer.sync()
                row["compile_warmup_s"][key] = time.perf_counter() - t0
                t[key] = timer(fn)
            except Exception as e:  # noqa: BLE001
                row["compile_error"] = (row["compile_error"] or "") + f"[{key}] {_err_text(e)} "
                log(f"  {label}: {key} failed: {_err_text(e)}")
        if row["compile_error"] is None and "compile_fwd" in t and t["compile_fwd"] is not None:
            try:  # (not under no_grad: that would be a guard miss and a recompile)
                ref = reference_log_lik(counts.double(), la.double())
                row["err_compile_fwd"] = _rel_err(compiled(counts, la), ref)
                del ref
            except Exception:  # noqa: BLE001
                pass
        del compiled, cases
    del nxt
    _free(device)

    ext_f, ext_fb = _med(t["ext_fwd"]), _med(t["ext_fwdbwd"])
    row["ratio_fwd_floor"] = ext_f / row["floor_fwd_us"]
    row["ratio_fwdbwd_floor"] = ext_fb / row["floor_fwdbwd_us"]
    row["speedup_fwd_vs_eager"] = _med(t["eager_fwd"]) / ext_f
    row["speedup_fwdbwd_vs_eager"] = _med(t["eager_fwdbwd"]) / ext_fb
    return row


def bench_small(counts: torch.Tensor, log_alpha: torch.Tensor, timer: Timer,
                device: torch.device) -> dict:
    """The small-problem targets' peers, timed interleaved with this
    package's forward and forward+backward (Timer.paired): host time
    dominates all four, and it drifts between separate timing loops."""
    la_g = log_alpha.detach().clone().requires_grad_(True)
    nxt = rotation(counts, l2_bytes(device))
    res = timer.paired({
        "add1": lambda: nxt().add(1),
        "ext_fwd": lambda: log_lik(nxt(), log_alpha),
        "trivial_grad": lambda: torch.autograd.grad((nxt() * la_g).sum(), la_g),
        "ext_fwdbwd": lambda: torch.autograd.grad(log_lik(nxt(), la_g).sum(), la_g),
    })
    return {"B": counts.shape[0], "V": counts.shape[1], **res}


def bench_components(B: int, V: int, K: int, g: torch.Generator, device: torch.device,
                     timer: Timer, bw: float, log: Callable[[str], None]) -> dict:
    counts = make_counts(Shape("components", B, V), g, device)
    la = make_log_alpha((K, V), g, device)
    la_g = la.detach().clone().requires_grad_(True)
    fwd_bytes = counts.numel() * F32 + K * V * F32 + B * K * F32
    fb_bytes = fwd_bytes + B * K * F32 + K * V * F32
    res = {"B": B, "V": V, "K": K, "floor_fwd_us": fwd_bytes / bw * 1e6,
           "floor_fwdbwd_us": fb_bytes / bw * 1e6, "times": {}}

    def separate(a, c=counts):
        return torch.stack([log_lik(c, a[k]) for k in range(K)], dim=1)

    with torch.no_grad():
        out = log_lik_components(counts, la)
        c64 = counts.double()
        ref = torch.stack([reference_log_lik(c64, la[k].double()) for k in range(K)], dim=1)
        res["err_fwd"] = _rel_err(out, ref)
        res["err_fwd_separate"] = _rel_err(separate(la), ref)
        del out, ref, c64
    (g_fused,) = torch.autograd.grad(log_lik_components(counts, la_g).sum(), la_g)
    (g_sep,) = torch.autograd.grad(separate(la_g).sum(), la_g)
    res["grad_diff_fused_vs_separate"] = _rel_err(g_fused, g_sep.double())
    del g_fused, g_sep
    t = res["times"]
    nxt = rotation(counts, l2_bytes(device))
    log(f"  components K={K}: fused")
    t["fused_fwd"] = timer(lambda: log_lik_components(nxt(), la))
    t["fused_fwdbwd"] = timer(
        lambda: torch.autograd.grad(log_lik_components(nxt(), la_g).sum(), la_g))
    log(f"  components K={K}: {K} separate log_lik calls")
    t["separate_fwd"] = timer(lambda: separate(la, nxt()))
    t["separate_fwdbwd"] = timer(lambda: torch.autograd.grad(separate(la_g, nxt()).sum(), la_g))
    del nxt
    res["ratio_fwd_floor"] = _med(t["fused_fwd"]) / res["floor_fwd_us"]
    res["ratio_fwdbwd_floor"] = _med(t["fused_fwdbwd"]) / res["floor_fwdbwd_us"]
    res["speedup_fwd_vs_separate"] = _med(t["separate_fwd"]) / _med(t["fused_fwd"])
    res["speedup_fwdbwd_vs_separate"] = _med(t["separate_fwdbwd"]) / _med(t["fused_fwdbwd"])
    _free(device)
    return res


# ---------------------------------------------------------------------- targets
def evaluate_targets(rows: Dict[str, dict], small: Optional[dict], device: torch.device) -> list:
    """The performance targets of issue 3. ``applies_to`` says on which device
    a target is defined; on the other device it is shown for information."""
    out = []

    def add(label, value, limit, *, at_most=True, applies_to="cuda", missing=""):
        if value is None:
            met = None
        else:
            met = value <= limit if at_most else value >= limit
        out.append({"target": label, "value": value, "limit": limit,
                    "kind": "at_most" if at_most else "at_least", "met": met,
                    "applies_to": applies_to, "applies": device.type == applies_to,
                    "missing": missing if value is None else ""})

    def get(name, key):
        r = rows.get(name)
        return None if r is None else r.get(key)

    for name, lim in (("tall", 1.25), ("sparse", 1.25), ("wide", 1.5), ("mid", 2.0)):
        add(f"forward {name} <= {lim:g}x floor", get(name, "ratio_fwd_floor"), lim,
            missing=f"shape {name} not run")
    for name in ("tall", "sparse"):
        add(f"forward+backward {name} <= 2.5x floor", get(name, "ratio_fwdbwd_floor"), 2.5,
            missing=f"shape {name} not run")
    seed = rows.get("seed")
    v1 = v2 = None
    if seed is not None and small is not None:
        v1 = _med(small["ext_fwd"]) / _med(small["add1"])
        v2 = _med(small["ext_fwdbwd"]) / _med(small["trivial_grad"])
    add("seed forward <= 1.5x counts.add(1)", v1, 1.5, missing="shape seed not run")
    add("seed forward+backward <= 1.5x trivial grad", v2, 1.5, missing="shape seed not run")
    add("per-sample tall forward <= 1.5x floor (counts + alpha bytes)",
        get("tall/per-sample", "ratio_fwd_floor"), 1.5, missing="run with --per-sample")
    add("CPU mid forward >= 5x faster than eager", get("mid", "speedup_fwd_vs_eager"), 5.0,
        at_most=False, applies_to="cpu", missing="shape mid not run")
    add("CPU mid forward+backward >= 5x faster than eager",
        get("mid", "speedup_fwdbwd_vs_eager"), 5.0, at_most=False, applies_to="cpu",
        missing="shape mid not run")
    return out


# ----------------------------------------------------------------------- output
def _fmt_us(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if x >= 1000:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _fmt_ratio(x: Optional[float]) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def _fmt_err(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def render_table(header: List[str], body: List[List[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i < 2 else "--:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(header)]
    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


MAIN_HEADER = ["name", "BxV", "floor", "ext fwd", "eager fwd", "compile fwd", "ext fwd+bwd",
               "eager fwd+bwd", "compile fwd+bwd", "ext/floor fwd", "ext/floor f+b",
               "err fwd", "err grad"]


def main_table_rows(rows: List[dict]) -> List[List[str]]:
    body = []
    for r in rows:
        t = r["times"]
        body.append([r["name"], f"{r['B']}x{r['V']}", _fmt_us(r["floor_fwd_us"]),
                     _fmt_us(_med(t["ext_fwd"])), _fmt_us(_med(t["eager_fwd"])),
                     _fmt_us(_med(t["compile_fwd"])), _fmt_us(_med(t["ext_fwdbwd"])),
                     _fmt_us(_med(t["eager_fwdbwd"])), _fmt_us(_med(t["compile_fwdbwd"])),
                     _fmt_ratio(r["ratio_fwd_floor"]), _fmt_ratio(r["ratio_fwdbwd_floor"]),
                     _fmt_err(r["err_fwd"]), _fmt_err(r["err_grad"])])
    return body


def report(result: dict, markdown: bool) -> str:
    env = result["env"]
    out = []
    b = "- " if markdown else ""
    out.append(f"{b}dirmult_ext {env['dirmult_ext_version']} on {env['device']} "
               f"({env['device_name']}), torch {env['torch']}, "
               f"threads {env['torch_num_threads']}, seed {env['seed']}, {env['date']}")
    cp = result["copy"]
    out.append(f"{b}copy bandwidth {cp['bytes_per_s'] / 1e9:.1f} GB/s "
               f"({cp['bytes_copied'] / 2**20:.0f} MiB dst.copy_(src), read+write counted); "
               "times in us, median per call")
    if result["timer"].get("mode") == "queued":
        out.append(f"{b}timing: queued (CUDA events around each call, no synchronize between "
                   "calls: GPU time where the GPU is the bottleneck, host time where the host "
                   "is); counts rotated among copies that do not fit in L2 together")
    elif result["timer"].get("mode") == "synced":
        out.append(f"{b}timing: synced (CUDA events around each call and a synchronize after "
                   "it: host + GPU time + launch latency); counts rotated among copies that "
                   "do not fit in L2 together")
    elif result["timer"].get("mode") == "graph":
        out.append(f"{b}timing: graph ({Timer.GRAPH_CALLS} calls captured in a CUDA graph, "
                   "the graph replayed: GPU time per call with no host in the way, less than "
                   "an eager call costs where the host is the bottleneck); counts rotated "
                   "among copies that do not fit in L2 together")
    out.append("")
    out.append(render_table(MAIN_HEADER, main_table_rows(result["shapes"]), markdown))
    for f in result["failed"]:
        out.append(f"{b}FAILED {f['name']} {f['shape']}: {f['error']}")
    errs = [f"{r['name']}: {r['compile_error']}" for r in result["shapes"] if r["compile_error"]]
    if errs:
        out.append("")
        out.extend(f"{b}torch.compile n/a -- {e}" for e in errs)
    if result.get("compile_note"):
        out.append("")
        out.append(f"{b}{result['compile_note']}")
    comp = result.get("components")
    if comp:
        out.append("")
        t = comp["times"]
        hdr = ["case", "BxV, K", "floor fwd", "fused fwd", f"{comp['K']}x log_lik fwd",
               "floor f+b", "fused fwd+bwd", f"{comp['K']}x log_lik f+b", "fused/floor fwd",
               "fused/floor f+b", "err fwd"]
        body = [["components", f"{comp['B']}x{comp['V']}, K={comp['K']}",
                 _fmt_us(comp["floor_fwd_us"]), _fmt_us(_med(t["fused_fwd"])),
                 _fmt_us(_med(t["separate_fwd"])), _fmt_us(comp["floor_fwdbwd_us"]),
                 _fmt_us(_med(t["fused_fwdbwd"])), _fmt_us(_med(t["separate_fwdbwd"])),
                 _fmt_ratio(comp["ratio_fwd_floor"]), _fmt_ratio(comp["ratio_fwdbwd_floor"]),
                 _fmt_err(comp["err_fwd"])]]
        out.append(render_table(hdr, body, markdown))
        if markdown:
            out.append("")
        out.append(f"{b}components: fused is {comp['speedup_fwd_vs_separate']:.2f}x (fwd), "
                   f"{comp['speedup_fwdbwd_vs_separate']:.2f}x (fwd+bwd) faster than "
                   f"{comp['K']} separate log_lik calls")
    small = result.get("small")
    seed = next((r for r in result["shapes"] if r["name"] == "seed"), None)
    out.append("")
    if small and seed:
        a1, tg = _med(small["add1"]), _med(small["trivial_grad"])
        ef, efb = _med(small["ext_fwd"]), _med(small["ext_fwdbwd"])
        out.append(f"{b}small problem (seed {small['B']}x{small['V']}, calls interleaved): "
                   f"counts.add(1) "
                   f"{_fmt_us(a1)} us vs ext fwd {_fmt_us(ef)} us ({ef / a1:.2f}x); "
                   f"trivial grad {_fmt_us(tg)} us vs ext fwd+bwd {_fmt_us(efb)} us "
                   f"({efb / tg:.2f}x)")
    else:
        out.append(f"{b}small problem: n/a (shape seed not run)")
    out.append("")
    graph_note = (" GPU time per call (graph timing); the targets are per eager call, "
                  "queued timing" if result["timer"].get("mode") == "graph" else "")
    out.append(f"{b}targets (issue 3), on {env['device']}:{graph_note}")
    for tg in result["targets"]:
        if tg["met"] is None:
            status = f"n/a ({tg['missing']})"
            if not tg["applies"]:
                status += f"  [a {tg['applies_to']} target]"
        elif not tg["applies"]:
            # A cpu target's value on a cuda run is the cuda speedup, and so
            # on: shown, not judged.
            status = (f"a {tg['applies_to']} target, not judged on {env['device']} "
                      f"(this run's value: {tg['value']:.2f}x)")
        else:
            status = "met" if tg["met"] else "NOT met"
            status = f"{status} ({tg['value']:.2f}x)"
        out.append(f"{'  - ' if markdown else '  '}{tg['target']}: {status}")
    return "\n".join(out)


def _environment(device: torch.device, argv: List[str], seed: int) -> dict:
    info = build_info()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        extra = {"gpu_name": name, "gpu_memory_bytes": props.total_memory,
                 "gpu_capability": f"{props.major}.{props.minor}",
                 "gpu_multiprocessors": props.multi_processor_count}
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        extra = {"gpu_name": None}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "device_name": name, **extra,
        "cpu_count": os.cpu_count(), "torch_num_threads": torch.get_num_threads(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": platform.python_version(), "platform": platform.platform(),
        "dirmult_ext_version": __version__, "build_info": info,
        "command_line": [sys.executable] + list(sys.argv),
        "bench_argv": None if argv is None else list(argv),
        "seed": seed,
    }


# ------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="dirmult-ext bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None,
                   help="cpu or cuda[:i] (default: cuda if available with the CUDA kernels, else cpu)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="NAME[=BxV[:DENSITY]]",
                   help="shapes to run: a default name (seed mid tall wide sparse) or "
                        "name=BxV[:density] to override/add one (density: fraction of "
                        "nonzeros, values 1+Poisson(3); without it integers 0..9)")
    p.add_argument("--per-sample", action="store_true",
                   help="also time per-sample log_alpha (counts' shape) at 'tall'")
    p.add_argument("--components", nargs="?", type=int, const=16, default=None, metavar="K",
                   help="also time log_lik_components with K components (default 16) "
                        "against K separate log_lik calls")
    p.add_argument("--components-shape", type=_parse_bxv, default=None, metavar="BxV",
                   help="shape for --components (default 65536x1024 on CUDA, 4096x1024 on CPU)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, few repetitions (smoke run)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--timing", choices=("queued", "synced", "graph"), default="queued",
                   help="CUDA: 'queued' (default): events around each call, no synchronize "
                        "between calls (the steady state of a training loop); 'synced': a "
                        "synchronize after each call (the latency of an isolated call); "
                        "'graph': calls replayed from a CUDA graph (GPU time per call, no "
                        "host in the way)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of timed calls per measurement (default 0.2 CUDA, 0.25 CPU)")
    p.add_argument("--seed", type=int, default=None, help="data seed (default: from the clock)")
    p.add_argument("--json", nargs="?", const="bench.json", default=None, metavar="PATH",
                   help="write all numbers and the environment as JSON to PATH "
                        "(default bench.json; '-' for stdout)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"[bench] {msg}", file=sys.stderr, flush=True)

    if args.device is None:
        device = torch.device("cuda" if torch.cuda.is_available() and CUDA_KERNELS else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("dirmult-ext bench: CUDA is not available in this torch", file=sys.stderr)
            return 2
        if not CUDA_KERNELS:
            print("dirmult-ext bench: the dirmult CUDA kernels are not loaded "
                  "(built without CUDA?); use --device cpu", file=sys.stderr)
            return 2
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # events and launches go to this device's current stream
    elif device.type != "cpu":
        print(f"dirmult-ext bench: unsupported device {device}", file=sys.stderr)
        return 2

    kind = "quick" if args.quick else device.type
    defaults = {"quick": QUICK_SHAPES, "cuda": CUDA_SHAPES, "cpu": CPU_SHAPES}[kind]
    try:
        shapes = parse_shapes(args.shapes, defaults) if args.shapes else list(defaults)
    except ValueError as e:
        p.error(str(e))
    if args.components is not None and args.components < 1:
        p.error("--components K needs K >= 1")

    if args.quick:
        timer_kw = dict(warmup=1, min_reps=3, max_reps=50, min_time=0.01)
    elif device.type == "cuda":
        timer_kw = dict(warmup=5, min_reps=50, max_reps=20000, min_time=0.2)
    else:
        # (the float64 check before the timings has already run each op once)
        timer_kw = dict(warmup=1, min_reps=5, max_reps=1000, min_time=0.25)
    if args.min_time is not None:
        timer_kw["min_time"] = args.min_time
    timer = Timer(device, **timer_kw, timing=args.timing)
    timer_kw["mode"] = timer.mode

    seed = args.seed if args.seed is not None else time.time_ns() % (2**31 - 1)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    print(f"dirmult-ext bench: device {device}, seed {seed}", file=sys.stderr if args.quiet
          else sys.stdout, flush=True)
    t_run = time.perf_counter()

    log("copy bandwidth")
    copy = copy_bandwidth(device, timer, args.quick)
    bw = copy["bytes_per_s"]

    # With --quick, one dynamic-shape compile serves all shapes (to keep the
    # smoke run short); otherwise each shape is compiled afresh, static.
    do_compile = not args.no_compile
    compile_dynamic = args.quick
    rows: List[dict] = []
    failed: List[dict] = []
    small = None
    for shape in shapes:
        log(f"{shape.name} {shape.bxv}")
        counts = make_counts(shape, g, device)
        la = make_log_alpha((shape.V,), g, device)
        try:
            row = bench_case(shape.name, counts, la, timer, bw, do_compile=do_compile,
                             compile_dynamic=compile_dynamic, device=device, log=log)
            row["density"] = shape.density
            rows.append(row)
            if shape.name == "seed":
                log("seed: counts.add(1), trivial grad")
                small = bench_small(counts, la, timer, device)
        except Exception as e:  # noqa: BLE001 - report, go on with the other shapes
            traceback.print_exc()
            failed.append({"name": shape.name, "shape": shape.bxv, "error": _err_text(e)})
        del counts, la
        _free(device)

    if args.per_sample:
        tall = next((s for s in shapes if s.name == "tall"), None) or \
            next(s for s in defaults if s.name == "tall")
        log(f"tall/per-sample {tall.bxv}")
        counts = make_counts(tall, g, device)
        la = make_log_alpha((tall.B, tall.V), g, device)
        try:
            row = bench_case("tall/per-sample", counts, la, timer, bw, do_compile=do_compile,
                             compile_dynamic=compile_dynamic, device=device, log=log)
            row["density"] = tall.density
            rows.append(row)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append({"name": "tall/per-sample", "shape": tall.bxv, "error": _err_text(e)})
        del counts, la
        _free(device)

    components = None
    if args.components is not None:
        B, V = args.components_shape or COMPONENTS_SHAPE[kind]
        log(f"components {B}x{V}, K={args.components}")
        try:
            components = bench_components(B, V, args.components, g, device, timer, bw, log)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append({"name": "components", "shape": f"{B}x{V}, K={args.components}",
                           "error": _err_text(e)})

    by_name = {r["name"]: r for r in rows}
    result = {
        "env": _environment(device, argv, seed),
        "timer": timer_kw,
        "copy": copy,
        "shapes": rows,
        "failed": failed,
        "small": small,
        "components": components,
        "targets": evaluate_targets(by_name, small, device),
        "compile_note": ("--quick: torch.compile(dynamic=True), one graph for all shapes"
                         if do_compile and compile_dynamic else
                         ("torch.compile skipped (--no-compile)" if not do_compile else "")),
    }
    result["runtime_s"] = time.perf_counter() - t_run

    # Sanity: the ext forward/gradient against float64 (same bound as `dirmult-ext check`
    # for the forward; the gradient sums over all rows, so a looser one).
    bad = [f"{r['name']}: err fwd {r['err_fwd']:.1e}, err grad {r['err_grad']:.1e}"
           for r in rows if not (r["err_fwd"] < 1e-5 and r["err_grad"] < 1e-4)]
    if components and not components["err_fwd"] < 1e-5:
        bad.append(f"components: err fwd {components['err_fwd']:.1e}")
    bad += [f"{f['name']} ({f['shape']}) raised {f['error']}" for f in failed]
    result["sanity_ok"] = not bad

    print(report(result, args.markdown))
    print(f"\nruntime {result['runtime_s']:.1f} s")
    if bad:
        print("SANITY CHECK FAILED (an error raised, or error vs float64 above 1e-5 fwd / "
              "1e-4 grad): " + "; ".join(bad))

    if args.json is not None:
        text = json.dumps(_nan_to_none(result), indent=1, default=str, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
            log(f"wrote {args.json}")
    return 0 if not bad else 1


def _nan_to_none(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


if __name__ == "__main__":
    sys.exit(main())
