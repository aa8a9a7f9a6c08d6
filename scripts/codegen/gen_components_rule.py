"""Refits the cost models behind the CUDA components' choice of way
(`components_as_shared_forward` / `_backward`,
src/cuda/component_table_kernels.cuh) from timings of the fused way and of
K log_lik calls, and lists the shapes where the fitted rules pick the
slower way.

    python scripts/codegen/gen_components_rule.py [FILE ...]

FILE: output of scripts/tuning/components_crossover.py from a build that takes
the fused way on every shape (make both rules return false for that run),
one shape per line (B V K | fwd op fwd sep ratio | bwd op bwd sep ratio |
...); lines not starting with a number are skipped, "nan" marks a time
that is not the fused way's. Default: scripts/tuning/data/components_crossover_h200.txt,
the H200 data the shipped coefficients come from.

Each way's time is a linear model in a few shape features, fitted by least
squares of the relative error (every shape weighs the same, whatever its
time). The features are the C++ rules': per component, per (component,
column), per element and per (element, component) for the K log_lik calls
and the fused forward; for the fused backward, the math path below 32 rows
(per row and per element per block of 4 components) and the component
tables from 32 rows (per element, and per element times V). Prints the
coefficients rounded to three digits, as the C++ takes them, and the
shapes those rounded rules misjudge.
"""
import argparse
import math
import os

import torch

TABLE_MIN_ROWS = 32  # kComponentBackwardTableMinRows

FEATURES = {
    "shared": lambda B, V, K: [K, K * V, K * B * V],
    "fused_fwd": lambda B, V, K: [1, K * V, B * V, K * B * V],
    "fused_bwd_math": lambda B, V, K: [1, K * V, B, math.ceil(K / 4) * B * V],
    "fused_bwd_table": lambda B, V, K: [1, K * V, B * V, B * V * V],
}


def read(paths):
    rows = []
    for path in paths:
        for line in open(path):
            p = line.replace("|", " ").split()
            if len(p) >= 9 and p[0].isdigit():
                B, V, K = map(int, p[:3])
                fo, fs, _, bo, bs = map(float, p[3:8])
                rows.append((B, V, K, fo, fs, bo, bs))
    return rows


def fit(shapes, times, kind):
    """Coefficients of FEATURES[kind] minimizing sum((model / time - 1)^2)."""
    X = torch.tensor([FEATURES[kind](*s) for s in shapes], dtype=torch.float64)
    y = torch.tensor(times, dtype=torch.float64)
    coef = torch.linalg.lstsq(X / y[:, None], torch.ones_like(y)[:, None]).solution[:, 0]
    return [float(f"{c:.3g}") for c in coef.tolist()]


def predict(coef, kind, B, V, K):
    return sum(c * f for c, f in zip(coef, FEATURES[kind](B, V, K)))


DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tuning", "data",
                            "components_crossover_h200.txt")


def split_ways(rows):
    """(shape, fused time, K calls' time) of the forward and of the backward,
    without the times marked nan."""
    fwd = [(r[:3], r[3], r[4]) for r in rows if not math.isnan(r[3])]
    bwd = [(r[:3], r[5], r[6]) for r in rows if not math.isnan(r[5])]
    return fwd, bwd


def fit_all(rows):
    """Every model's coefficients, rounded to three digits."""
    fwd, bwd = split_ways(rows)
    c = {
        "shared_fwd": fit([s for s, _, _ in fwd], [t for _, _, t in fwd], "shared"),
        "fused_fwd": fit([s for s, _, _ in fwd], [t for _, t, _ in fwd], "fused_fwd"),
        "shared_bwd": fit([s for s, _, _ in bwd], [t for _, _, t in bwd], "shared"),
    }
    for kind, keep in (("fused_bwd_math", lambda B: B < TABLE_MIN_ROWS),
                       ("fused_bwd_table", lambda B: B >= TABLE_MIN_ROWS)):
        sel = [(s, t) for s, t, _ in bwd if keep(s[0])]
        c[kind] = fit([s for s, _ in sel], [t for _, t in sel], kind)
    return c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=[DEFAULT_DATA])
    rows = read(p.parse_args().files)
    fwd, bwd = split_ways(rows)
    c = fit_all(rows)
    print(f"{len(rows)} shapes; coefficients (us) of the features "
          "[per component, per (component, column), per element, ...] as in fit_components_rule.FEATURES:")
    for name, coef in c.items():
        print(f"  {name:<16} {coef}")

    def misjudged(cases, shared_of, fused_of):
        wrong = []
        for (B, V, K), fused_t, shared_t in cases:
            picks_shared = shared_of(B, V, K) < fused_of(B, V, K)
            if picks_shared != (shared_t < fused_t):
                wrong.append((B, V, K, max(fused_t, shared_t) / min(fused_t, shared_t)))
        return wrong

    def fused_bwd(B, V, K):
        kind = "fused_bwd_math" if B < TABLE_MIN_ROWS else "fused_bwd_table"
        return predict(c[kind], kind, B, V, K)

    for label, cases, shared_of, fused_of in (
            ("forward", fwd, lambda *s: predict(c["shared_fwd"], "shared", *s),
             lambda *s: predict(c["fused_fwd"], "fused_fwd", *s)),
            ("backward", bwd, lambda *s: predict(c["shared_bwd"], "shared", *s), fused_bwd)):
        wrong = misjudged(cases, shared_of, fused_of)
        print(f"{label}: the slower way on {len(wrong)} of {len(cases)} shapes" +
              "".join(f"\n  {B}x{V} K={K}: {r:.2f}x slower" for B, V, K, r in wrong))


if __name__ == "__main__":
    main()
