"""Forwards to profile: a few calls of `log_lik` at each shape given, for
Nsight Compute to pick kernels from (`ncu -k regex:NAME -c N ...`; see
scripts/ncu_source_blocks.py). Counts are integers 0..9 and log_alpha
U(-2, 3), as in the benchmark; a shape ending in `:ps` takes per-sample
log_alpha (B, V) instead of shared (V,).

    python3 scripts/launch_forwards.py 64x262144 65536x1024:ps [--calls 2]
"""
import argparse

import torch

import dirmult_ext


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", help="BxV, or BxV:ps for per-sample log_alpha")
    parser.add_argument("--calls", type=int, default=2, help="forwards per shape")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    for spec in args.shapes:
        shape, _, kind = spec.partition(":")
        B, V = (int(x) for x in shape.lower().split("x"))
        counts = torch.randint(0, 10, (B, V), generator=g, device="cuda").float()
        alpha_shape = (B, V) if kind == "ps" else (V,)
        log_alpha = torch.empty(alpha_shape, device="cuda").uniform_(-2, 3, generator=g)
        with torch.no_grad():
            for _ in range(args.calls):
                dirmult_ext.log_lik(counts, log_alpha)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
