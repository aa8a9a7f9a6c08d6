"""Time the dirmult ops against their peers.

For each shape (float32 counts, one log_alpha shared by all rows) it times,
on one device, forward and forward+backward (the gradient of the summed
log-likelihood with respect to log_alpha):

* dirmult_ext.log_lik;
* the eager float32 reference, dirmult_ext.reference_log_lik;
* the same reference under torch.compile (a compile error is reported as
  n/a; --no-compile skips it);
* NumPyro's DirichletMultinomial.log_prob under jax.jit, when jax and
  numpyro are importable (timed on the host clock, each call blocking
  until its result is ready; --no-numpyro skips it);
* the floor: the bytes that must move (counts read once, log_alpha, the
  output; for forward+backward also the incoming gradient and the gradient
  written) divided by the copy bandwidth measured in this run.

With --regression [P] it also times the DM regression, log_lik_regression
with P covariates (default 16), against X @ W + bias followed by log_lik
and the eager reference (regression_cases; floor: counts and X read once).

With --em [K] it times a K-component mixture's EM iteration on CSR counts
(em_cases: against its E-step's forward and, on CUDA, streamed from pinned
host memory against the copy of the CSR bytes).

With --sparse it times CSR counts instead (sparse_cases: a prepared
SparseCounts against the CSR floor, the hand-written PyTorch over the
nonzeros and the dense op on the densified matrix where it fits; with
--shapes as well, both).

At the seed shape it also times counts.add(1) and a trivial gradient
(autograd.grad((counts * la).sum(), la)) interleaved with this package's
forward and forward+backward; it checks the forward and the gradient
against float64 on every shape, and prints whether the performance targets
are met.

Timing: warm-up calls first (for torch.compile and jax.jit the compiling
calls are warm-up), then timed calls until both a minimum number of calls
and a minimum time are reached; the median per call is reported, in
microseconds. On CUDA, counts that fit in L2 are rotated among copies. On
the CPU, time.perf_counter around each call; the torch thread count is left
as it is.

Data is fresh each run (seeded from the clock; the seed is printed and
written to the JSON; --seed repeats a run). Plot a JSON with
python -m dirmult_ext.bench.plot BENCH.json OUT.png (needs matplotlib).
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from typing import List, Optional

import torch

from ...ops.library import CUDA_KERNELS
from . import peers
from .cases import COMPONENTS_SHAPE, DEFAULT_SHAPES, make_counts, make_log_alpha, parse_bxv, parse_shapes
from .measure import bench_case, bench_components, bench_small, err_text, free
from .regression_cases import REGRESSION_SHAPE, bench_regression
from .report import environment, evaluate_targets, report, sanity_problems, to_json
from .sparse_cases import SPARSE_SHAPES, bench_sparse
from .em_cases import EM_SHAPES, bench_em
from .timing import TIMINGS, Timer


def _bxv(text: str):
    try:
        return parse_bxv(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dirmult-ext bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None,
                   help="cpu or cuda[:i] (default: cuda if available with the CUDA kernels, "
                        "else cpu)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="NAME[=BxV[:DENSITY]]",
                   help="shapes to run: a default name (seed mid tall wide sparse) or "
                        "name=BxV[:density] to override/add one (density: fraction of "
                        "nonzeros, values 1+Poisson(3); without it integers 0..9)")
    p.add_argument("--per-sample", action="store_true",
                   help="also time per-sample log_alpha (counts' shape) at 'tall'")
    p.add_argument("--components", nargs="?", type=int, const=16, default=None, metavar="K",
                   help="also time log_lik_components with K components (default 16) "
                        "against K separate log_lik calls")
    p.add_argument("--components-shape", type=_bxv, default=None, metavar="BxV",
                   help="shape for --components (default 65536x1024 on CUDA, 4096x1024 on CPU)")
    p.add_argument("--regression", nargs="?", type=int, const=16, default=None, metavar="P",
                   help="also time log_lik_regression with P covariates (default 16) against "
                        "X @ W + bias then log_lik, and the eager reference")
    p.add_argument("--regression-shape", type=_bxv, default=None, metavar="BxV",
                   help="shape for --regression (default 65536x1024 on CUDA, 4096x1024 on CPU)")
    p.add_argument("--sparse", action="store_true",
                   help="time CSR counts (SparseCounts): 16384x16384 at 1%%, 200000x30000 at "
                        "3%% (and K=16 components there), 1000000x50000 at 0.2%% on CUDA, "
                        "smaller on the CPU; the dense shapes only if --shapes is given too")
    p.add_argument("--em", nargs="?", type=int, const=10, default=None, metavar="K",
                   help="time a K-component mixture's EM iteration (default 10) on CSR counts "
                        "against its E-step's forward and, on CUDA, streamed from pinned host "
                        "memory against the copy of the CSR bytes (1000000x50000 at 0.2%% on "
                        "CUDA, 8192x2048 at 3%% on the CPU)")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, few repetitions (a smoke run of seconds)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--no-numpyro", action="store_true", help="skip the NumPyro peer")
    p.add_argument("--timing", choices=TIMINGS, default="queued",
                   help="'queued' (default): CUDA events around each call, no synchronize "
                        "between calls (the steady state of a training loop); 'synced': a "
                        "synchronize after each call (the latency of an isolated call); "
                        "'graph' (CUDA only): calls replayed from a CUDA graph (GPU time per "
                        "call, no host in the way)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of timed calls per measurement (default 0.2 CUDA, 0.25 CPU)")
    p.add_argument("--seed", type=int, default=None, help="data seed (default: from the clock)")
    p.add_argument("--json", nargs="?", const="bench.json", default=None, metavar="PATH",
                   help="write all numbers and the environment as JSON to PATH "
                        "(default bench.json; '-' for stdout)")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _device(arg: Optional[str]):
    """The device to run on, or an error message."""
    if arg is None:
        return torch.device("cuda" if torch.cuda.is_available() and CUDA_KERNELS else "cpu"), ""
    try:
        device = torch.device(arg)
    except RuntimeError:
        return None, f"--device: expected cpu or cuda[:i], got {arg!r}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None, "CUDA is not available in this torch"
        if not CUDA_KERNELS:
            return None, ("the dirmult CUDA kernels are not loaded (built without CUDA?); "
                          "use --device cpu")
    elif device.type != "cpu":
        return None, f"--device: expected cpu or cuda[:i], got {arg!r}"
    return device, ""


def timer_settings(device: torch.device, quick: bool) -> dict:
    if quick:
        return dict(warmup=1, min_reps=3, max_reps=50, min_time=0.01)
    if device.type == "cuda":
        return dict(warmup=5, min_reps=50, max_reps=20000, min_time=0.2)
    # (the float64 check before the timings has already run each op once)
    return dict(warmup=1, min_reps=5, max_reps=1000, min_time=0.25)


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        if not args.quiet:
            print(f"[bench] {msg}", file=sys.stderr, flush=True)

    device, problem = _device(args.device)
    if device is None:
        print(f"dirmult-ext bench: {problem}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # events and launches go to this device's current stream
    if args.timing == "graph" and device.type != "cuda":
        p.error(f"--timing graph replays CUDA graphs and needs a CUDA device, got {device}")

    kind = "quick" if args.quick else device.type
    defaults = DEFAULT_SHAPES[kind]
    try:
        shapes = parse_shapes(args.shapes, defaults) if args.shapes else \
            ([] if args.sparse or args.em is not None else list(defaults))
    except ValueError as e:
        p.error(f"--shapes: {e}")
    if args.components is not None and args.components < 1:
        p.error("--components K needs K >= 1")
    if args.regression is not None and args.regression < 1:
        p.error("--regression P needs P >= 1")
    if args.em is not None and args.em < 1:
        p.error("--em K needs K >= 1")

    timer_kw = timer_settings(device, args.quick)
    if args.min_time is not None:
        timer_kw["min_time"] = args.min_time
    timer = Timer(device, **timer_kw, timing=args.timing)

    seed = args.seed if args.seed is not None else time.time_ns() % (2**31 - 1)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    print(f"dirmult-ext bench: device {device}, seed {seed}",
          file=sys.stderr if args.quiet else sys.stdout, flush=True)
    t_run = time.perf_counter()

    log("copy bandwidth")
    copy = peers.copy_bandwidth(device, timer, args.quick)
    bw = copy["bytes_per_s"]
    numpyro, numpyro_note = (None, "NumPyro peer skipped (--no-numpyro)") if args.no_numpyro \
        else peers.numpyro_peer(device)
    if numpyro_note:
        log(numpyro_note)

    # With --quick, one dynamic-shape compile serves all shapes (to keep the
    # smoke run short); otherwise each shape is compiled afresh, static.
    do_compile = not args.no_compile
    compile_dynamic = args.quick
    rows: List[dict] = []
    failed: List[dict] = []
    small = None

    def run_case(label, shape, la_shape, with_small=False):
        nonlocal small
        log(f"{label} {shape.bxv}")
        counts = make_counts(shape, g, device)
        la = make_log_alpha(la_shape, g, device)
        try:
            row = bench_case(label, counts, la, timer, bw, do_compile=do_compile,
                             compile_dynamic=compile_dynamic, device=device, log=log,
                             numpyro=numpyro)
            row["density"] = shape.density
            rows.append(row)
            if with_small:
                log("seed: counts.add(1), trivial grad")
                small = bench_small(counts, la, timer, device)
        except Exception as e:  # noqa: BLE001 - report, go on with the other shapes
            traceback.print_exc()
            failed.append({"name": label, "shape": shape.bxv, "error": err_text(e)})
        del counts, la
        free(device)

    for shape in shapes:
        run_case(shape.name, shape, (shape.V,), with_small=shape.name == "seed")
    if args.per_sample:
        tall = next((s for s in shapes if s.name == "tall"), None) or \
            next(s for s in defaults if s.name == "tall")
        run_case("tall/per-sample", tall, (tall.B, tall.V))

    components = None
    if args.components is not None:
        B, V = args.components_shape or COMPONENTS_SHAPE[kind]
        log(f"components {B}x{V}, K={args.components}")
        try:
            components = bench_components(B, V, args.components, g, device, timer, bw, log)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append({"name": "components", "shape": f"{B}x{V}, K={args.components}",
                           "error": err_text(e)})

    regression = None
    if args.regression is not None:
        B, V = args.regression_shape or REGRESSION_SHAPE[kind]
        log(f"regression {B}x{V}, P={args.regression}")
        try:
            regression = bench_regression(B, V, args.regression, g, device, timer, bw, log)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append({"name": "regression", "shape": f"{B}x{V}, P={args.regression}",
                           "error": err_text(e)})

    sparse = None
    if args.sparse:
        sparse = bench_sparse(SPARSE_SHAPES[kind], g, device, timer, bw, log)

    em = None
    if args.em is not None:
        shape = EM_SHAPES[kind]
        log(f"em {shape.bxv}, K={args.em}")
        try:
            em = bench_em(shape, args.em, g, device, timer.with_timing("synced"), log)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            failed.append({"name": "em", "shape": f"{shape.bxv}, K={args.em}",
                           "error": err_text(e)})

    result = {
        "env": environment(device, argv, seed),
        "timer": timer.describe(),
        "copy": copy,
        "shapes": rows,
        "failed": failed,
        "small": small,
        "components": components,
        "regression": regression,
        "sparse": sparse,
        "em": em,
        "targets": evaluate_targets({r["name"]: r for r in rows}, small, device, sparse, em),
        "compile_note": ("--quick: torch.compile(dynamic=True), one graph for all shapes"
                         if do_compile and compile_dynamic else
                         ("torch.compile skipped (--no-compile)" if not do_compile else "")),
        "numpyro_note": numpyro_note,
    }
    result["runtime_s"] = time.perf_counter() - t_run
    bad = sanity_problems(result)
    result["sanity_ok"] = not bad

    print(report(result, args.markdown))
    print(f"\nruntime {result['runtime_s']:.1f} s")
    if bad:
        print("SANITY CHECK FAILED (an error raised, or error vs float64 above 1e-5 fwd / "
              "1e-4 grad): " + "; ".join(bad))
    if args.json is not None:
        text = to_json(result)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
            log(f"wrote {args.json}")
    return 0 if not bad else 1
