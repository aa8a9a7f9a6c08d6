"""Where the CUDA components op should run log_lik's shared-alpha kernels
once per component instead of its fused component-table kernels: both
timed on a grid of (B, V, K), forward and backward, so that the rule
(`components_per_component_forward` and `_backward`, src/cuda/policy.cu) rests on
measurements.

    python scripts/tuning/components_crossover.py [--rows 1 4 16 ...] [--cols ...] [--components ...]

For each shape it times, paired (one replay of each in turn, CUDA graphs:
the GPU time per call), on the benchmark's counts (integers 0..9) and a
cache-defeating rotation of them:
  op      torch.ops.dirmult.log_lik_components / _backward, as built (it
          takes whichever path the rule picks);
  sep     K calls of torch.ops.dirmult.log_lik / log_lik_backward, one per
          component, stacked (what the per-component path runs, plus the
          stacking);
and prints both, their ratio, and whether the op's outputs are log_lik's
bits per component. With DIRMULT_CUDA_COMPONENTS=fused, 'op' is the fused
way on every shape: the crossover, and the data scripts/codegen/gen_components_rule.py
fits (scripts/tuning/data/components_crossover_h200.txt; on another GPU, a refit);
unset, 'op' follows the rule, which checks that it picks the faster way.
"""
import argparse
import time

import torch

import dirmult_ext  # noqa: F401  (loads the ops)
from dirmult_ext.cli.bench.cases import Shape, l2_bytes, make_counts, make_log_alpha, rotation
from dirmult_ext.cli.bench.timing import Timer

ops = torch.ops.dirmult


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64, 128, 512, 2048])
    p.add_argument("--cols", type=int, nargs="+", default=[4096, 65536, 262144])
    p.add_argument("--components", type=int, nargs="+", default=[2, 4, 16])
    p.add_argument("--max-elements", type=int, default=1 << 26,
                   help="skip shapes with more counts than this")
    args = p.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    timer = Timer(dev, warmup=3, min_reps=5 * Timer.GRAPH_CALLS, max_reps=5 * Timer.GRAPH_CALLS,
                  min_time=0.0, timing="graph")
    g = torch.Generator(device=dev).manual_seed(int(time.time()))
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}; GPU us per call "
          "(CUDA graph); op = log_lik_components, sep = K log_lik calls")
    print(f"{'B':>6} {'V':>7} {'K':>3} | {'fwd op':>8} {'fwd sep':>8} {'op/sep':>6} | "
          f"{'bwd op':>8} {'bwd sep':>8} {'op/sep':>6} | bits")
    for V in args.cols:
        for B in args.rows:
            if B * V > args.max_elements:
                continue
            counts = make_counts(Shape("components", B, V), g, dev)
            nxt = rotation(counts, l2_bytes(dev))
            for K in args.components:
                la = make_log_alpha((K, V), g, dev)
                grad = torch.rand((B, K), device=dev, generator=g)

                def fwd_sep(c=None):
                    c = nxt() if c is None else c
                    return torch.stack([ops.log_lik(c, la[k], False) for k in range(K)], dim=1)

                def bwd_sep(c=None):
                    c = nxt() if c is None else c
                    return torch.stack([ops.log_lik_backward(grad[:, k].contiguous(), c, la[k],
                                                             False, False)[0]
                                        for k in range(K)])

                same = (torch.equal(ops.log_lik_components(counts, la, False), fwd_sep(counts))
                        and torch.equal(ops.log_lik_components_backward(grad, counts, la),
                                        bwd_sep(counts)))
                f = timer.paired({"op": lambda: ops.log_lik_components(nxt(), la, False),
                                  "sep": fwd_sep})
                b = timer.paired({"op": lambda: ops.log_lik_components_backward(grad, nxt(), la),
                                  "sep": bwd_sep})
                fo, fs = f["op"]["median_us"], f["sep"]["median_us"]
                bo, bs = b["op"]["median_us"], b["sep"]["median_us"]
                print(f"{B:>6} {V:>7} {K:>3} | {fo:8.1f} {fs:8.1f} {fo / fs:6.2f} | "
                      f"{bo:8.1f} {bs:8.1f} {bo / bs:6.2f} | {'same' if same else 'differ'}",
                      flush=True)
            del counts, nxt
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
