"""The benchmark's result: the performance targets, the environment, and
its rendering as text, Markdown and JSON."""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
from typing import Dict, List, Optional

import torch

from ..._version import __version__
from ... import build_info
from .measure import median
from .regression_cases import regression_table
from .timing import Timer


# ------------------------------------------------------------------ targets
def evaluate_targets(rows: Dict[str, dict], small: Optional[dict], device: torch.device,
                     sparse: Optional[List[dict]] = None, em: Optional[dict] = None) -> list:
    """The performance targets, each with its value in this run. ``applies_to``
    says on which device a target is defined; on the other device it is
    shown for information, not judged."""
    out = []

    def add(key, label, value, limit, *, at_most=True, applies_to="cuda", missing=""):
        met = None if value is None else (value <= limit if at_most else value >= limit)
        out.append({"id": key, "target": label, "value": value, "limit": limit,
                    "kind": "at_most" if at_most else "at_least", "met": met,
                    "applies_to": applies_to, "applies": device.type == applies_to,
                    "missing": missing if value is None else ""})

    def get(name, key):
        r = rows.get(name)
        return None if r is None else r.get(key)

    for name, lim in (("tall", 1.25), ("sparse", 1.25), ("wide", 1.5), ("mid", 2.0)):
        add(f"fwd_floor_{name}", f"forward within {lim:g}x of the floor at {name}",
            get(name, "ratio_fwd_floor"), lim, missing=f"shape {name} not run")
    for name in ("tall", "sparse"):
        add(f"fwdbwd_floor_{name}", f"forward+backward within 2.5x of the floor at {name}",
            get(name, "ratio_fwdbwd_floor"), 2.5, missing=f"shape {name} not run")
    v1 = v2 = None
    if rows.get("seed") is not None and small is not None:
        v1 = median(small["ext_fwd"]) / median(small["add1"])
        v2 = median(small["ext_fwdbwd"]) / median(small["trivial_grad"])
    add("fwd_add1_seed", "forward within 1.5x of counts.add(1) at seed", v1, 1.5,
        missing="shape seed not run")
    add("fwdbwd_trivial_grad_seed",
        "forward+backward within 1.5x of a trivial gradient at seed", v2, 1.5,
        missing="shape seed not run")
    add("per_sample_fwd_floor_tall",
        "per-sample forward within 1.5x of its floor (counts + alpha bytes) at tall",
        get("tall/per-sample", "ratio_fwd_floor"), 1.5, missing="run with --per-sample")
    add("cpu_fwd_vs_eager_mid", "forward at least 5x faster than eager at mid",
        get("mid", "speedup_fwd_vs_eager"), 5.0, at_most=False, applies_to="cpu",
        missing="shape mid not run")
    add("cpu_fwdbwd_vs_eager_mid", "forward+backward at least 5x faster than eager at mid",
        get("mid", "speedup_fwdbwd_vs_eager"), 5.0, at_most=False, applies_to="cpu",
        missing="shape mid not run")

    by_name = {r["name"]: r for r in sparse or []}

    def sp(name, key):
        r = by_name.get(name)
        v = None if r is None else r.get(key)
        return v, ("run with --sparse" if sparse is None else
                   f"sparse {name}: " + (r.get("error") or "n/a") if r is not None
                   else f"sparse {name} not run")
    for name in ("csr_tall", "csr_huge"):
        v, why = sp(name, "ratio_fwd_floor")
        add(f"sparse_fwd_csr_floor_{name}", f"CSR forward within 2x of the CSR floor at {name}",
            v, 2.0, missing=why)
        v, why = sp(name, "ratio_fwdbwd_floor")
        add(f"sparse_fwdbwd_csr_floor_{name}",
            f"CSR forward+backward within 3.5x of the CSR floor at {name}", v, 3.5,
            missing=why)
    comp, why = sp("csr_tall", "components")
    K = 16 if comp is None else comp["K"]
    add("sparse_components_vs_single_csr_tall",
        f"CSR K={K} components forward at most 6x the single-component forward at csr_tall",
        None if comp is None else comp.get("ratio_vs_single"), 6.0, missing=why)
    em_why = "run with --em" if em is None else ""
    add("em_iter_vs_estep", "EM iteration at most 2.5x its E-step's forward, matrix on the device",
        None if em is None else em.get("ratio_iter_estep"), 2.5, missing=em_why)
    add("em_streamed_vs_copy",
        "streamed EM iteration at most max(1.5x the copy of the CSR bytes, the on-device one)",
        None if em is None else em.get("ratio_streamed_target"), 1.0,
        missing=em_why or "streamed on CUDA only")
    return out


def sanity_problems(result: dict) -> List[str]:
    """Failed cases, and this package's error against float64 above 1e-5
    (forward; the bound of ``dirmult-ext check``) or 1e-4 (the gradient,
    a sum over all rows)."""
    bad = [f"{r['name']}: err fwd {r['err_fwd']:.1e}, err grad {r['err_grad']:.1e}"
           for r in result["shapes"] if not (r["err_fwd"] < 1e-5 and r["err_grad"] < 1e-4)]
    comp = result.get("components")
    if comp and not comp["err_fwd"] < 1e-5:
        bad.append(f"components: err fwd {comp['err_fwd']:.1e}")
    reg = result.get("regression")
    if reg and not (reg["err_fwd"] < 1e-5 and reg["err_grad"] < 1e-4):
        bad.append(f"regression: err fwd {reg['err_fwd']:.1e}, err grad {reg['err_grad']:.1e}")
    bad += [f"{f['name']} ({f['shape']}) raised {f['error']}" for f in result["failed"]]
    for r in result.get("sparse") or []:
        if r.get("error"):
            bad.append(f"sparse {r['name']} raised {r['error']}")
        elif not (r["err_fwd"] < 1e-5 and r["err_grad"] < 1e-4
                  and r.get("err_components_fwd", 0.0) < 1e-5):
            bad.append(f"sparse {r['name']}: err fwd {r['err_fwd']:.1e}, err grad "
                       f"{r['err_grad']:.1e}, err components {r.get('err_components_fwd')}")
    return bad


# -------------------------------------------------------------- environment
def environment(device: torch.device, argv: Optional[List[str]], seed: int) -> dict:
    info = build_info()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        extra = {"gpu_name": name, "gpu_memory_bytes": props.total_memory,
                 "gpu_capability": f"{props.major}.{props.minor}",
                 "gpu_multiprocessors": props.multi_processor_count}
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        extra = {"gpu_name": None}
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device), "device_name": name, **extra,
        "cpu_count": os.cpu_count(), "torch_num_threads": torch.get_num_threads(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": platform.python_version(), "platform": platform.platform(),
        "dirmult_ext_version": __version__, "build_info": info,
        "command_line": [sys.executable] + list(sys.argv),
        "bench_argv": None if argv is None else list(argv),
        "seed": seed,
    }


# ------------------------------------------------------------------- JSON
def _nan_to_none(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


def to_json(result: dict) -> str:
    """Strict JSON (a non-finite number becomes null)."""
    return json.dumps(_nan_to_none(result), indent=1, default=str, allow_nan=False)


# ------------------------------------------------------------------- tables
def fmt_us(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    if x >= 1000:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_ratio(x: Optional[float]) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def fmt_err(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def render_table(header: List[str], body: List[List[str]], markdown: bool) -> str:
    """Two left-aligned label columns, the others right-aligned."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i < 2 else "--:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h)
              for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in body])


def main_table(rows: List[dict], markdown: bool) -> str:
    """One line per case; the NumPyro columns only where it was timed."""
    numpyro = any(r["times"].get("numpyro_fwd") or r["times"].get("numpyro_fwdbwd")
                  for r in rows)
    header = ["name", "BxV", "floor", "ext fwd", "eager fwd", "compile fwd"]
    header += ["numpyro fwd"] if numpyro else []
    header += ["ext fwd+bwd", "eager fwd+bwd", "compile fwd+bwd"]
    header += ["numpyro fwd+bwd"] if numpyro else []
    header += ["ext/floor fwd", "ext/floor f+b", "err fwd", "err grad"]
    body = []
    for r in rows:
        t = r["times"]
        cells = [r["name"], f"{r['B']}x{r['V']}", fmt_us(r["floor_fwd_us"]),
                 fmt_us(median(t["ext_fwd"])), fmt_us(median(t["eager_fwd"])),
                 fmt_us(median(t["compile_fwd"]))]
        cells += [fmt_us(median(t.get("numpyro_fwd")))] if numpyro else []
        cells += [fmt_us(median(t["ext_fwdbwd"])), fmt_us(median(t["eager_fwdbwd"])),
                  fmt_us(median(t["compile_fwdbwd"]))]
        cells += [fmt_us(median(t.get("numpyro_fwdbwd")))] if numpyro else []
        cells += [fmt_ratio(r["ratio_fwd_floor"]), fmt_ratio(r["ratio_fwdbwd_floor"]),
                  fmt_err(r["err_fwd"]), fmt_err(r["err_grad"])]
        body.append(cells)
    return render_table(header, body, markdown)


def components_table(comp: dict, markdown: bool) -> str:
    t, K = comp["times"], comp["K"]
    header = ["case", "BxV, K", "floor fwd", "fused fwd", f"{K}x log_lik fwd",
              "floor f+b", "fused fwd+bwd", f"{K}x log_lik f+b", "fused/floor fwd",
              "fused/floor f+b", "err fwd"]
    body = [["components", f"{comp['B']}x{comp['V']}, K={K}",
             fmt_us(comp["floor_fwd_us"]), fmt_us(median(t["fused_fwd"])),
             fmt_us(median(t["separate_fwd"])), fmt_us(comp["floor_fwdbwd_us"]),
             fmt_us(median(t["fused_fwdbwd"])), fmt_us(median(t["separate_fwdbwd"])),
             fmt_ratio(comp["ratio_fwd_floor"]), fmt_ratio(comp["ratio_fwdbwd_floor"]),
             fmt_err(comp["err_fwd"])]]
    return render_table(header, body, markdown)


def sparse_table(entries: List[dict], markdown: bool) -> str:
    """One line per CSR shape: this package, the hand-written PyTorch and the
    dense op, forward and forward+backward; the CSR floor; errors."""
    header = ["name", "BxV:density", "nnz", "CSR floor", "ext fwd", "hand fwd", "dense fwd",
              "ext fwd+bwd", "hand fwd+bwd", "dense fwd+bwd", "ext/floor fwd",
              "ext/floor f+b", "K comp fwd", "K comp/single", "err fwd", "err grad",
              "err hand fwd"]
    body = []
    for r in entries:
        label = [r["name"], f"{r['B']}x{r['V']}:{r['density']:g}"]
        if r.get("error"):
            body.append(label + [f"n/a ({r['error'][:60]})"] + ["n/a"] * (len(header) - 3))
            continue
        t, c = r["times"], r.get("components") or {}
        body.append(label + [
            str(r["nnz"]), fmt_us(r["floor_us"]), fmt_us(median(t.get("ext_fwd"))),
            fmt_us(median(t.get("handwritten_fwd"))), fmt_us(median(t.get("dense_fwd"))),
            fmt_us(median(t.get("ext_fwdbwd"))), fmt_us(median(t.get("handwritten_fwdbwd"))),
            fmt_us(median(t.get("dense_fwdbwd"))), fmt_ratio(r["ratio_fwd_floor"]),
            fmt_ratio(r["ratio_fwdbwd_floor"]),
            f"K={c['K']}: {fmt_us(c.get('fwd_us'))}" if c else "-",
            fmt_ratio(c.get("ratio_vs_single")) if c else "-",
            fmt_err(r.get("err_fwd")), fmt_err(r.get("err_grad")),
            fmt_err(r.get("err_handwritten_fwd"))])
    return render_table(header, body, markdown)


TIMING_TEXT = {
    "cuda_events/queued": "queued (CUDA events around each call, no synchronize between "
                          "calls: GPU time where the GPU is the bottleneck, host time where "
                          "the host is)",
    "cuda_events/synced": "synced (CUDA events around each call and a synchronize after it: "
                          "host + GPU time + launch latency)",
    "cuda_graph_replay/graph": f"graph ({Timer.GRAPH_CALLS} calls captured in a CUDA graph, "
                               "the graph replayed: GPU time per call with no host in the "
                               "way, less than an eager call costs where the host is the "
                               "bottleneck)",
}


def em_table(em: dict, markdown: bool) -> str:
    """One line per way of holding the matrix: us per EM iteration and its
    ratio to the E-step's forward (float64, as the fit computes it) and to
    the copy of the CSR bytes."""
    fwd = median(em["times"]["estep_fwd_f64"])
    body = [["on the device", fmt_us(em["on_device"]["iter_us"]), fmt_us(fwd),
             fmt_ratio(em["ratio_iter_estep"]), "", ""]]
    if "streamed" in em:
        body.append([f"streamed, {em['stream_batch_rows']}-row blocks",
                     fmt_us(em["streamed"]["iter_us"]), fmt_us(fwd),
                     fmt_ratio(em["streamed"]["iter_us"] / fwd), fmt_us(em["copy_us"]),
                     fmt_ratio(em["ratio_streamed_copy"])])
    header = ["EM iteration", "us", "E-step fwd (f64)", "x E-step", "copy", "x copy"]
    title = (f"EM, K={em['K']}, {em['B']}x{em['V']} at {em['density']:g} "
             f"({em['nnz']} nonzeros); E-step fwd float32 "
             f"{fmt_us(median(em['times']['estep_fwd_f32']))} us")
    return title + "\n" + render_table(header, body, markdown)


def timing_line(timer: dict) -> str:
    clock, mode = timer.get("clock"), timer.get("mode")
    if clock == "perf_counter":
        return f"timing: {mode}, time.perf_counter around each call"
    text = TIMING_TEXT.get(f"{clock}/{mode}", f"{mode} ({clock})")
    return f"timing: {text}; counts rotated among copies that do not fit in L2 together"


def _target_status(tg: dict, device: str) -> str:
    if tg["met"] is None:
        status = f"n/a ({tg['missing']})"
        if not tg["applies"]:
            status += f"  [a {tg['applies_to']} target]"
        return status
    if not tg["applies"]:
        # A cpu target's value on a cuda run is the cuda speed-up, and so on:
        # shown, not judged.
        return (f"a {tg['applies_to']} target, not judged on {device} "
                f"(this run's value: {tg['value']:.2f}x)")
    return f"{'met' if tg['met'] else 'NOT met'} ({tg['value']:.2f}x)"


def report(result: dict, markdown: bool) -> str:
    """The whole result as text (or Markdown): environment, timing, one
    table line per case, components, small problem, targets."""
    env = result["env"]
    b = "- " if markdown else ""
    out = [f"{b}dirmult_ext {env['dirmult_ext_version']} on {env['device']} "
           f"({env['device_name']}), torch {env['torch']}, "
           f"threads {env['torch_num_threads']}, seed {env['seed']}, {env['date']}"]
    cp = result["copy"]
    out.append(f"{b}copy bandwidth {cp['bytes_per_s'] / 1e9:.1f} GB/s "
               f"({cp['bytes_copied'] / 2**20:.0f} MiB dst.copy_(src), read+write counted); "
               "times in us, median per call")
    out.append(f"{b}{timing_line(result['timer'])}")
    if result["shapes"] or not (result.get("sparse") or result.get("em")):
        out.append("")
        out.append(main_table(result["shapes"], markdown))
    for f in result["failed"]:
        out.append(f"{b}FAILED {f['name']} {f['shape']}: {f['error']}")
    notes = [f"torch.compile n/a -- {r['name']}: {r['compile_error']}"
             for r in result["shapes"] if r["compile_error"]]
    notes += [f"numpyro n/a -- {r['name']}: {r['numpyro_error']}"
              for r in result["shapes"] if r.get("numpyro_error")]
    notes += [n for n in (result.get("compile_note"), result.get("numpyro_note")) if n]
    if notes:
        out.append("")
        out.extend(f"{b}{n}" for n in notes)
    sparse = result.get("sparse")
    if sparse:
        out.append("")
        out.append(sparse_table(sparse, markdown))
        if markdown:
            out.append("")
        out.append(f"{b}sparse: CSR counts (float32 values, int32 indices) as a prepared "
                   "SparseCounts; CSR floor = (values + column index per nonzero, row "
                   "offsets, alpha, output) bytes / copy bandwidth; hand = the PyTorch over "
                   "the nonzeros (lgamma, index_add_); dense = log_lik on the densified "
                   f"matrix (n/a above {8} GiB); errors vs float64 on the first 256 rows")
        notes = [f"sparse {r['name']}: {k} n/a -- {e}" for r in sparse
                 for k, e in (r.get("errors") or {}).items()]
        notes += [f"sparse {r['name']}: dense {r['dense']}" for r in sparse
                  if str(r.get("dense", "")).startswith("skipped")]
        out.extend(f"{b}{n}" for n in notes)
    em = result.get("em")
    if em:
        out.append("")
        out.append(em_table(em, markdown))
        if markdown:
            out.append("")
        out.append(f"{b}em: one K-component EM run from random responsibilities, "
                   "DMMixture.iter_s (the fit's wall time per iteration, synchronized by its "
                   "own convergence test); E-step fwd = log_lik_components on the same CSR; "
                   "copy = the CSR bytes from pinned host memory to the device in the "
                   "streamed blocks (CUDA events)")
    comp = result.get("components")
    if comp:
        out.append("")
        out.append(components_table(comp, markdown))
        if markdown:
            out.append("")
        out.append(f"{b}components: fused is {comp['speedup_fwd_vs_separate']:.2f}x (fwd), "
                   f"{comp['speedup_fwdbwd_vs_separate']:.2f}x (fwd+bwd) faster than "
                   f"{comp['K']} separate log_lik calls")
    reg = result.get("regression")
    if reg:
        out.append("")
        out.append(regression_table(reg, markdown))
        if markdown:
            out.append("")
        out.append(f"{b}regression: the op's forward {reg['ratio_fwd_floor']:.2f}x the floor "
                   f"(target 1.5x), forward+backward {reg['ratio_fwdbwd_floor']:.2f}x (target "
                   f"3x); {reg['speedup_fwd_vs_unfused']:.2f}x (fwd), "
                   f"{reg['speedup_fwdbwd_vs_unfused']:.2f}x (fwd+bwd) faster than X @ W + "
                   "bias then log_lik; floor: counts and X read once")
    small = result.get("small")
    seed = next((r for r in result["shapes"] if r["name"] == "seed"), None)
    out.append("")
    if small and seed:
        a1, tg = median(small["add1"]), median(small["trivial_grad"])
        ef, efb = median(small["ext_fwd"]), median(small["ext_fwdbwd"])
        out.append(f"{b}small problem (seed {small['B']}x{small['V']}, calls interleaved): "
                   f"counts.add(1) {fmt_us(a1)} us vs ext fwd {fmt_us(ef)} us "
                   f"({ef / a1:.2f}x); trivial grad {fmt_us(tg)} us vs ext fwd+bwd "
                   f"{fmt_us(efb)} us ({efb / tg:.2f}x)")
    else:
        out.append(f"{b}small problem: n/a (shape seed not run)")
    out.append("")
    graph_note = (" (GPU time per call, graph timing; the targets are per eager call, "
                  "queued timing)" if result["timer"].get("mode") == "graph" else "")
    out.append(f"{b}targets, on {env['device']}{graph_note}:")
    for tg in result["targets"]:
        out.append(f"{'  - ' if markdown else '  '}{tg['target']}: "
                   f"{_target_status(tg, env['device'])}")
    return "\n".join(out)
