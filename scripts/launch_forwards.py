"""Forwards to profile: a few calls of `log_lik` at each shape given, for
Nsight Compute to pick kernels from (`ncu -k regex:NAME -c N ...`; see
scripts/ncu_source_blocks.py). The benchmark's data (dirmult_ext.bench's
make_counts and make_log_alpha: integers 0..9, log_alpha U(-2, 3)); a
shape ending in `:ps` takes per-sample log_alpha (B, V) instead of shared
(V,).

    python3 scripts/launch_forwards.py 64x262144 65536x1024:ps [--calls 2]
"""
import argparse

import torch

import dirmult_ext
from dirmult_ext.bench import Shape, make_counts, make_log_alpha


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", help="BxV, or BxV:ps for per-sample log_alpha")
    parser.add_argument("--calls", type=int, default=2, help="forwards per shape")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    cuda = torch.device("cuda")
    g = torch.Generator(device=cuda).manual_seed(args.seed)
    for spec in args.shapes:
        shape, _, kind = spec.partition(":")
        B, V = (int(x) for x in shape.lower().split("x"))
        counts = make_counts(Shape(spec, B, V), g, cuda)
        log_alpha = make_log_alpha((B, V) if kind == "ps" else (V,), g, cuda)
        with torch.no_grad():
            for _ in range(args.calls):
                dirmult_ext.log_lik(counts, log_alpha)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
