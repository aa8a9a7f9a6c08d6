"""Where a call's time goes, on CUDA: for each benchmark shape, the GPU time
of every kernel of a forward and of a forward+backward (torch.profiler, 20
calls, per-call means), their sum, the GPU time per call with no host in
the way (the benchmark's graph timing: 64 calls captured in a CUDA graph,
the graph replayed 11 times, median; the launch gaps between a call's
kernels included, which the kernel sum leaves out), and the host time per
call (20 calls back to back without a synchronize, over 20).

    python scripts/kernel_breakdown.py [--shapes seed mid tall wide sparse]

The graph time against the benchmark's queued time says whether the call
is GPU-bound (they agree) or host-bound (the host time is larger).
"""
import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import dirmult_ext
from dirmult_ext.bench import CUDA_SHAPES, Timer, make_counts, make_log_alpha

CALLS = 20


def host_us(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / CALLS * 1e6


def graph_us(fn):
    """GPU time per call of fn replayed from a CUDA graph (the benchmark's
    graph timing: Timer.GRAPH_CALLS calls per graph, 11 replays, median);
    None where the call cannot be captured."""
    timer = Timer(torch.device("cuda", torch.cuda.current_device()), warmup=3,
                  min_reps=11 * Timer.GRAPH_CALLS, max_reps=11 * Timer.GRAPH_CALLS,
                  min_time=0.0, timing="graph")
    try:
        return timer(fn)["median_us"]
    except RuntimeError as e:
        print(f"    (not captured: {str(e).splitlines()[0][:100]})")
        return None


def kernels(fn):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:70]] += ev.device_time / CALLS
    return per


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=[s.name for s in CUDA_SHAPES])
    args = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(int(time.time()))
    for shape in (s for s in CUDA_SHAPES if s.name in args.shapes):
        counts = make_counts(shape, g, torch.device("cuda"))
        la = make_log_alpha((shape.V,), g, torch.device("cuda"))
        la_g = la.clone().requires_grad_(True)
        cases = {
            "fwd": lambda: dirmult_ext.log_lik(counts, la),
            "fwd+bwd": lambda: torch.autograd.grad(dirmult_ext.log_lik(counts, la_g).sum(), la_g),
            "add(1)": lambda: counts.add(1),
            "trivial grad": lambda: torch.autograd.grad((counts * la_g).sum(), la_g),
        }
        for name, fn in cases.items():
            for _ in range(5):
                fn()
            per = kernels(fn)
            h = host_us(fn)
            gr = graph_us(fn)
            total = sum(per.values())
            gpu = "n/a" if gr is None else f"{gr:.1f} us"
            print(f"{shape.name} {shape.B}x{shape.V} {name}: kernels {total:.1f} us, "
                  f"GPU (graph) {gpu}, host {h:.1f} us per call")
            for k, us in sorted(per.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f}  {k}")
        del counts
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
