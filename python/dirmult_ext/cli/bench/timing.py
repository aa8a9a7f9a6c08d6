"""Median time per call, in microseconds, after warm-up."""
from __future__ import annotations

import time
from typing import Callable, Dict, List

import torch

TIMINGS = ("queued", "synced", "graph")


class Timer:
    """Median per-call time in microseconds, after warm-up.

    ``timing`` picks how a call is timed:

    * ``queued`` (the default): on CUDA each call is bracketed by its own
      pair of CUDA events and calls follow each other without a
      synchronization (one per round of ``ROUND`` calls; the first call of a
      round, which starts on an idle GPU, is not counted), as in
      ``triton.testing.do_bench`` and as a training loop runs. A call's time
      is then its GPU time when the GPU is the bottleneck, and its host time
      (Python, dispatch, launches, the autograd engine) when the host is.
    * ``synced``: a synchronize after every call, so a call's time is its
      host time plus its GPU time plus the launch latency: the latency of
      one isolated call.
    * ``graph`` (CUDA only): ``GRAPH_CALLS`` calls captured in a CUDA graph
      (after warm-up on a side stream, as capture needs) and the graph
      replayed, one sample per replay (its time over ``GRAPH_CALLS``): the
      GPU time per call with no host in the way. A function that cannot be
      captured raises.

    On the CPU the clock is ``time.perf_counter`` around each call (``clock``
    says which clock a timer uses); ``queued`` and ``synced`` both apply
    there (a CPU call has finished when it returns, so they measure the same
    thing), ``graph`` is refused.

    Timed functions that return before their work is done on a stream of
    their own (jax) go through ``host_paired``, which uses the host clock on
    every device; such a function must block until its result is ready.
    """

    ROUND = 20
    # Calls per graph: the rotation's largest number of copies (cases.rotation),
    # so that a replay reads every copy.
    GRAPH_CALLS = 64

    def __init__(self, device: torch.device, *, warmup: int, min_reps: int, max_reps: int,
                 min_time: float, timing: str = "queued"):
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, got {timing!r}")
        device = torch.device(device)
        if timing == "graph" and device.type != "cuda":
            raise ValueError(f"timing 'graph' replays CUDA graphs and needs a CUDA device, "
                             f"got {device}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.mode = timing
        self.queued = timing == "queued"
        self.warmup, self.min_reps, self.max_reps, self.min_time = warmup, min_reps, max_reps, min_time
        self._events: List[torch.cuda.Event] = []

    @property
    def clock(self) -> str:
        if not self.cuda:
            return "perf_counter"
        return "cuda_graph_replay" if self.mode == "graph" else "cuda_events"

    def describe(self) -> dict:
        """The settings, as written to the JSON."""
        return {"mode": self.mode, "clock": self.clock, "warmup": self.warmup,
                "min_reps": self.min_reps, "max_reps": self.max_reps, "min_time": self.min_time}

    def with_timing(self, timing: str) -> "Timer":
        return Timer(self.device, warmup=self.warmup, min_reps=self.min_reps,
                     max_reps=self.max_reps, min_time=self.min_time, timing=timing)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _event_pairs(self, n: int) -> List[torch.cuda.Event]:
        while len(self._events) < 2 * n:
            self._events.append(torch.cuda.Event(enable_timing=True))
        return self._events

    def _round(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, List[float]]:
        """One call of each function per step, in turn; CUDA events on the
        current stream of the current device (the CLI sets the device)."""
        out: Dict[str, List[float]] = {name: [] for name in fns}
        if not self.cuda:
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                if not self.queued:
                    self.sync()
                out[name].append((time.perf_counter() - t0) * 1e6)
            return out
        steps = self.ROUND if self.queued else 1
        ev = self._event_pairs(steps * len(fns))
        k = 0
        for _ in range(steps):
            for fn in fns.values():
                ev[2 * k].record()
                fn()
                ev[2 * k + 1].record()
                k += 1
                if not self.queued:
                    self.sync()
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
    def summary(times: List[float]) -> Dict[str, float]:
        times = sorted(times)
        n = len(times)
        median = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
        return {"median_us": median, "min_us": times[0], "reps": n}

    def __call__(self, fn: Callable[[], object]) -> Dict[str, float]:
        return self.paired({"fn": fn})["fn"]

    def _done(self, reps: int, t_begin: float, nfns: int) -> bool:
        return reps >= self.max_reps or (
            reps >= self.min_reps and time.perf_counter() - t_begin >= self.min_time * nfns)

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
            if self._done(calls, t_begin, len(fns)):
                break
        del graphs
        return {name: self.summary(t) for name, t in times.items()}

    def paired(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, Dict[str, float]]:
        """Times several functions with their calls interleaved (one call of
        each per step, in turn; with graph timing, one replay of each), so
        that all of them see the same host and GPU conditions: their ratios
        do not drift with the machine's state."""
        if self.mode == "graph":
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
            if self._done(len(next(iter(times.values()))), t_begin, len(fns)):
                break
        return {name: self.summary(t) for name, t in times.items()}

    def host_paired(self, fns: Dict[str, Callable[[], object]]) -> Dict[str, Dict[str, float]]:
        """``paired`` on the host clock, whatever the device and timing:
        for functions that block until their own work is done."""
        for fn in fns.values():
            for _ in range(self.warmup):
                fn()
        times: Dict[str, List[float]] = {name: [] for name in fns}
        t_begin = time.perf_counter()
        while True:
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e6)
            if self._done(len(next(iter(times.values()))), t_begin, len(fns)):
                break
        return {name: self.summary(t) for name, t in times.items()}
