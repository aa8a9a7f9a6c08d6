"""A/B of two builds of the package on the same inputs: the forward's GPU
time per call on a list of shapes, and the outputs saved so that the other
build's run compares them bitwise.

Build the baseline beside the tree (one device call for all of it):

    git archive HEAD | tar -x -C exp/old        # exp/ is untracked
    (cd exp/old && DIRMULT_CUDA_ARCHS=90 DIRMULT_BUILD_JOBS=8 python3 setup.py build_ext --inplace) &
    DIRMULT_CUDA_ARCHS=90 DIRMULT_BUILD_JOBS=8 python3 setup.py build_ext --inplace; wait
    for r in 1 2; do
      PYTHONPATH=exp/old/python python3 scripts/ab_compare.py old --out exp
      PYTHONPATH=python python3 scripts/ab_compare.py new --out exp
    done

Each run prints its label and the median time per call of every shape
(`--timing graph`: CUDA-graph replays, the GPU time), then, for every other
label's saved outputs in --out, whether they are bitwise equal to its own.
Inputs are drawn from a generator seeded by the shape, so both builds see the
same counts (integers 0..--max-count) and log_alpha (U(-2, 3); one per element
with --per-sample). Runs on CPU
too (then times are host times, `time.perf_counter`). If exp/ is listed in
.git/info/exclude, pass it to the device call's `carry`.
"""
import argparse
import os

import torch

import dirmult_ext
from dirmult_ext.bench import Timer

DEFAULT_SHAPES = ["64x262144", "8x262144", "1x262144", "40x210000", "5x100000", "8192x1024",
                  "65536x1024"]


def parse_shape(text: str):
    b, v = text.lower().split("x")
    return int(b), int(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("label", help="this build's name (its outputs go to OUT/ab_LABEL.pt)")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="BxV shapes")
    parser.add_argument("--out", default=".", help="folder for the saved outputs")
    parser.add_argument("--max-count", type=int, default=9)
    parser.add_argument("--per-sample", action="store_true",
                        help="log_alpha of the counts' shape (B, V) instead of (V,)")
    parser.add_argument("--timing", default="graph", choices=["graph", "queued", "synced"])
    parser.add_argument("--no-time", action="store_true", help="only compare the outputs")
    parser.add_argument("--grad", action="store_true",
                        help="time forward+backward (the gradient of a random weighting of the "
                             "rows with respect to log_alpha) and compare the gradients too")
    parser.add_argument("--normalize", action="store_true",
                        help="time the forward with normalize=True (both are compared)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    dev = torch.device(args.device)
    timer = Timer(dev, warmup=5, min_reps=20, max_reps=60, min_time=0.2, timing=args.timing)
    times, outs = [], {}
    for shape in args.shapes:
        B, V = parse_shape(shape)
        g = torch.Generator(device=dev).manual_seed(B * 7919 + V)
        counts = torch.randint(0, args.max_count + 1, (B, V), device=dev, generator=g).float()
        la = torch.empty((B, V) if args.per_sample else (V,), device=dev).uniform_(-2, 3, generator=g)
        if args.grad:
            la_g = la.clone().requires_grad_(True)
            w = torch.rand(B, device=dev, generator=g)

            def call():
                return torch.autograd.grad(dirmult_ext.log_lik(counts, la_g), la_g, w)[0]

            outs[shape] = call().cpu()
            if not args.no_time:
                times.append(f"{shape} {timer(call)['median_us']:.2f}")
            continue
        with torch.no_grad():
            outs[shape] = torch.stack([dirmult_ext.log_lik(counts, la, normalize=nm)
                                       for nm in (False, True)]).cpu()
            if not args.no_time:
                us = timer(lambda: dirmult_ext.log_lik(counts, la,
                                                       normalize=args.normalize))["median_us"]
                times.append(f"{shape} {us:.2f}")
    if times:
        print(args.label, " | ".join(times), flush=True)
    os.makedirs(args.out, exist_ok=True)
    torch.save(outs, os.path.join(args.out, f"ab_{args.label}.pt"))
    for name in sorted(os.listdir(args.out)):
        if not (name.startswith("ab_") and name.endswith(".pt")) or name == f"ab_{args.label}.pt":
            continue
        other = torch.load(os.path.join(args.out, name))
        common = [k for k in outs if k in other]
        same = [k for k in common if torch.equal(outs[k], other[k])]
        differ = [k for k in common if k not in same]
        rel = [f"{k}: {((outs[k] - other[k]).abs() / other[k].abs().clamp_min(1e-30)).max().item():.1e}"
               for k in differ]
        print(f"{args.label} vs {name[3:-3]}: bitwise equal on {len(same)} of {len(common)} shapes"
              + (f" (differ, largest relative difference: {', '.join(rel)})" if differ else ""))


if __name__ == "__main__":
    main()
