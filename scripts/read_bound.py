"""What merely reading the benchmark's bytes costs on this GPU, beside this
package's forward, for the two targets of issue 3 that are not met (wide,
and per-sample alpha at tall).

The floor of the targets is bytes / (a 2 GB copy's bandwidth). A kernel
that reads 64 MB (wide) does not reach that bandwidth: the ramp-up and the
tail of one short pass are a large part of it. This script times, in the
same process and on the same (cache-defeating) data rotation as the
benchmark, torch's own reductions over the same tensors, which do nothing
but read them (and, for per-sample, one exp per element), so the gap
between the floor and what any kernel reading these bytes achieves is
measured, not guessed.

    python scripts/read_bound.py [--timing graph|queued]

Prints one table per shape: the median GPU time per call (CUDA graph
replay by default, the benchmark's ``--timing graph``), its ratio to the
floor, and the target's limit.
"""
import argparse
import time

import torch

import dirmult_ext
from dirmult_ext.bench import Timer, copy_bandwidth, l2_bytes, rotation

F32 = 4


def timed(timer, fn):
    try:
        return timer(fn)["median_us"]
    except RuntimeError as e:  # e.g. a compiled function that cannot be captured
        print(f"    (not timed: {str(e).splitlines()[0][:100]})")
        return None


def show(title, floor_us, limit, rows):
    print(f"\n{title}: floor {floor_us:.1f} us, target {limit}x = {floor_us * limit:.1f} us")
    print(f"  {'case':<46} {'us':>8} {'x floor':>8}")
    for name, us in rows:
        if us is None:
            print(f"  {name:<46} {'-':>8} {'-':>8}")
        else:
            print(f"  {name:<46} {us:8.1f} {us / floor_us:8.2f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timing", choices=("graph", "queued"), default="graph")
    args = p.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    timer = Timer(dev, warmup=5, min_reps=11 * Timer.GRAPH_CALLS, max_reps=11 * Timer.GRAPH_CALLS,
                  min_time=0.0, timing=args.timing)
    bw = copy_bandwidth(dev, timer, quick=False)["bytes_per_s"]
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, timing {args.timing}, "
          f"copy bandwidth {bw / 1e9:.0f} GB/s")
    g = torch.Generator(device=dev).manual_seed(int(time.time()))
    l2 = l2_bytes(dev)

    # wide: 64 x 262144 float32 counts, shared alpha
    B, V = 64, 262144
    counts = torch.randint(0, 10, (B, V), generator=g, device=dev, dtype=torch.float32)
    la = torch.empty(V, device=dev).uniform_(-2.0, 3.0, generator=g)
    nxt = rotation(counts, l2)
    floor = (B * V + V + B) * F32 / bw * 1e6
    row_sum = torch.compile(lambda c: c.sum(1))
    show("wide 64x262144 (shared alpha)", floor, 1.5, [
        ("dirmult_ext.log_lik", timed(timer, lambda: dirmult_ext.log_lik(nxt(), la))),
        ("counts.sum(1) (torch's reduction, reads only)", timed(timer, lambda: nxt().sum(1))),
        ("counts.sum() (one output)", timed(timer, lambda: nxt().sum())),
        ("torch.compile(counts.sum(1))", timed(timer, lambda: row_sum(nxt()))),
    ])
    del counts, nxt

    # per-sample alpha at tall: 65536 x 1024 counts and log_alpha, both read
    B, V = 65536, 1024
    counts = torch.randint(0, 10, (B, V), generator=g, device=dev, dtype=torch.float32)
    la = torch.empty((B, V), device=dev).uniform_(-2.0, 3.0, generator=g)
    floor = (2 * B * V + B) * F32 / bw * 1e6
    read_two = torch.compile(lambda c, l: (c + l).sum(1))
    exp_sum = torch.compile(lambda c, l: (l.exp() + c).sum(1))
    show("per-sample 65536x1024 (counts and log_alpha read)", floor, 1.5, [
        ("dirmult_ext.log_lik", timed(timer, lambda: dirmult_ext.log_lik(counts, la))),
        ("torch.compile((c + la).sum(1)) (reads only)", timed(timer, lambda: read_two(counts, la))),
        ("torch.compile((la.exp() + c).sum(1))", timed(timer, lambda: exp_sum(counts, la))),
        ("la.exp().sum(1) (eager, two kernels)", timed(timer, lambda: la.exp().sum(1))),
    ])


if __name__ == "__main__":
    main()
