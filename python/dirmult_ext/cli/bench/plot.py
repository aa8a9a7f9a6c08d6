"""Plot a benchmark JSON: time per call of this package and its peers.

    python -m dirmult_ext.bench.plot BENCH.json OUT.png [--speedup]

BENCH.json is what ``dirmult-ext bench --json`` writes. Two panels,
forward and forward+backward; per shape one bar for this package, the eager
reference, torch.compile of it, NumPyro (where timed) and the floor, on a
log scale in microseconds; with --speedup, the speed-up over eager instead.
Needs matplotlib (imported only here).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional

# (key in a row's "times", legend label); the floor is the row's floor_*_us.
PEERS = [("ext", "dirmult_ext"), ("eager", "eager reference"),
         ("compile", "torch.compile"), ("numpyro", "NumPyro (jax.jit)")]
PASSES = [("fwd", "forward"), ("fwdbwd", "forward+backward")]


def series(result: dict, speedup: bool = False) -> Dict[str, Dict[str, List[Optional[float]]]]:
    """{pass: {label: one value per shape}}, shapes in the JSON's order, None
    where a peer was not timed; the floor as one more label. With
    ``speedup``, eager's time over each one's (eager itself is 1)."""
    rows = result["shapes"]
    out: Dict[str, Dict[str, List[Optional[float]]]] = {}
    for key, _ in PASSES:
        per: Dict[str, List[Optional[float]]] = {}
        for peer, label in PEERS + [("floor", "floor")]:
            vals = []
            for r in rows:
                if peer == "floor":
                    v = r.get(f"floor_{key}_us")
                else:
                    t = r["times"].get(f"{peer}_{key}")
                    v = None if t is None else t["median_us"]
                if speedup and v is not None:
                    eager = r["times"].get(f"eager_{key}")
                    v = None if eager is None or not v else eager["median_us"] / v
                vals.append(v)
            if any(v is not None for v in vals):
                per[label] = vals
        out[key] = per
    return out


def _import_pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("dirmult_ext.bench.plot needs matplotlib "
                          "(pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot(result: dict, out_path: str, speedup: bool = False) -> None:
    plt = _import_pyplot()
    names = [f"{r['name']}\n{r['B']}x{r['V']}" for r in result["shapes"]]
    if not names:
        raise ValueError("the benchmark JSON has no shapes to plot")
    data = series(result, speedup)
    fig, axes = plt.subplots(1, len(PASSES), figsize=(6 + 1.4 * len(names), 4.8), squeeze=False)
    for ax, (key, title) in zip(axes[0], PASSES):
        per = data[key]
        width = 0.8 / max(len(per), 1)
        for i, (label, vals) in enumerate(per.items()):
            xs = [j + (i - (len(per) - 1) / 2) * width for j in range(len(names))]
            pts = [(x, v) for x, v in zip(xs, vals) if v is not None]
            ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=label)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel("speed-up over eager" if speedup else "us per call (median)")
        if speedup:
            ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    env, timer = result.get("env", {}), result.get("timer", {})
    fig.suptitle(f"dirmult_ext {env.get('dirmult_ext_version', '?')} on "
                 f"{env.get('device_name') or env.get('device', '?')}, torch "
                 f"{env.get('torch', '?')}, timing {timer.get('mode', '?')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dirmult_ext.bench.plot",
                                description=__doc__.splitlines()[0])
    p.add_argument("bench_json", metavar="BENCH.json", help="written by dirmult-ext bench --json")
    p.add_argument("out", metavar="OUT.png", help="image to write (any matplotlib format)")
    p.add_argument("--speedup", action="store_true", help="speed-up over eager, not time")
    args = p.parse_args(argv)
    try:
        with open(args.bench_json) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        p.error(f"BENCH.json: cannot read {args.bench_json!r}: {e}")
    if not isinstance(result, dict) or "shapes" not in result:
        p.error(f"BENCH.json: {args.bench_json!r} is not a dirmult-ext bench JSON "
                "(no 'shapes')")
    try:
        plot(result, args.out, args.speedup)
    except (ImportError, ValueError) as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
