"""GPU time per call with counts off the lookup tables: rows of counts 0..9
with a fraction of them moved into a range (17..24, 33..64 and 65..128: the
chunked exact products where they apply; 200..999: the general path), for
shared alpha (wide 64x262144, tall 65536x1024) and per-sample alpha (tall),
forward and forward+backward (the gradient of the sum). Heavy-tailed counts
(single-cell, microbiome) put many counts there.

    python scripts/off_table_bench.py [--timing graph|queued|synced]

Times are medians per call in microseconds (dirmult_ext.bench.Timer).
"""
import argparse

import torch

import dirmult_ext as dm
from dirmult_ext.bench import Timer

# (low, high exclusive, fraction of the counts); None: counts 0..9 only
RANGES = [None, (17, 25, 0.01), (33, 65, 0.01), (65, 129, 0.01), (200, 1000, 0.01),
          (17, 49, 0.05)]
CASES = [(64, 262144, True), (65536, 1024, True), (65536, 1024, False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timing", default="graph", choices=["graph", "queued", "synced"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("off_table_bench.py times the CUDA kernels: no CUDA device here")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(torch.seed())
    timer = Timer(dev, warmup=5, min_reps=20, max_reps=100, min_time=0.2, timing=args.timing)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, timing {args.timing}, us")
    for B, V, shared in CASES:
        base = torch.randint(0, 10, (B, V), generator=g, device=dev, dtype=torch.float32)
        la = torch.rand(V if shared else (B, V), generator=g, device=dev) * 5 - 2
        la_g = la.clone().requires_grad_(True)
        cells = []
        for r in RANGES:
            counts = base.clone()
            label = "0..9"
            if r is not None:
                low, high, frac = r
                moved = torch.rand(B, V, generator=g, device=dev) < frac
                counts[moved] = torch.randint(low, high, (int(moved.sum()),), generator=g,
                                              device=dev).float()
                label = f"{frac:.0%} {low}..{high - 1}"
            t = timer.paired({
                "fwd": lambda: dm.log_lik(counts, la),
                "fb": lambda: torch.autograd.grad(dm.log_lik(counts, la_g).sum(), la_g),
            })
            cells.append(f"{label}: fwd {t['fwd']['median_us']:.1f} f+b {t['fb']['median_us']:.1f}")
        kind = "shared" if shared else "per-sample"
        print(f"{B}x{V} {kind}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
