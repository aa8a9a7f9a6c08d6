"""fit_regression by L-BFGS against Newton over shapes: iterations and the
median wall time of alternating runs, the data behind MAX_NEWTON_PARAMS and
MAX_NEWTON_WORK (models/regression/newton.py).

    PYTHONPATH=python:tests python scripts/tuning/regression_newton_crossover.py \
        200x3x6,3000x5x30 --reps 7 [--se]

A shape is ROWSxCOVARIATESxCATEGORIES; the data are simulated DM regressions
(tests/reference.py regression_counts, W ~ N(0, 0.25 / P), bias ~ N(0, 0.09)).
"""
import argparse
import time

import torch

from dirmult_ext import fit_regression
from reference import regression_counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", help="comma-separated ROWSxCOVARIATESxCATEGORIES")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--se", action="store_true", help="also compute the standard errors")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    fit_regression(*regression_counts(50, torch.zeros(2, 3, dtype=torch.float64),
                                      torch.zeros(3, dtype=torch.float64), generator=g))
    for shape in args.shapes.split(","):
        B, P, V = (int(t) for t in shape.split("x"))
        W = 0.5 * torch.randn(P, V, dtype=torch.float64, generator=g) / P ** 0.5
        b = 0.3 * torch.randn(V, dtype=torch.float64, generator=g)
        counts, X = regression_counts(B, W, b, generator=g)
        times = {"lbfgs": [], "newton": []}
        last = {}
        for rep in range(args.reps):
            for m in (["lbfgs", "newton"] if rep % 2 == 0 else ["newton", "lbfgs"]):
                t = time.perf_counter()
                last[m] = fit_regression(counts, X, method=m, se=args.se)
                times[m].append(time.perf_counter() - t)
        med = {m: sorted(ts)[len(ts) // 2] for m, ts in times.items()}
        n = (P + 1) * V
        print(f"{B}x{V} P={P} n={n} (P+1)n={(P + 1) * n}: "
              f"lbfgs {last['lbfgs'].n_iter} it {med['lbfgs'] * 1e3:.1f} ms, "
              f"newton {last['newton'].n_iter} it {med['newton'] * 1e3:.1f} ms, "
              f"lbfgs/newton {med['lbfgs'] / med['newton']:.2f}; grad "
              f"{last['lbfgs'].grad_norm:.1e} / {last['newton'].grad_norm:.1e}, log-lik "
              f"difference {last['newton'].log_lik - last['lbfgs'].log_lik:.1e}", flush=True)


if __name__ == "__main__":
    main()
