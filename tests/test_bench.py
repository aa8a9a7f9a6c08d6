"""Tests of ``dirmult-ext bench`` (the dirmult_ext.bench package): smoke
runs on the CPU, its modules one by one, the plot, and graph timing on CUDA."""
import contextlib
import io
import json
import math
import sys

import pytest
import torch

import dirmult_ext
from dirmult_ext.cli import bench
from dirmult_ext.cli.bench import cases, cli, peers, plot, report, sparse_cases
from dirmult_ext.cli.bench.timing import Timer

SHAPES = ["seed", "mid", "tall", "wide", "sparse"]
TIME_KEYS = ["ext_fwd", "ext_fwdbwd", "eager_fwd", "eager_fwdbwd"]
NUMPYRO = peers.numpyro_peer(torch.device("cpu"))[0] is not None


def _positive_finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _check_row(row, compiled):
    for key in ("floor_fwd_us", "floor_fwdbwd_us", "ratio_fwd_floor", "ratio_fwdbwd_floor",
                "speedup_fwd_vs_eager", "speedup_fwdbwd_vs_eager"):
        assert _positive_finite(row[key]), (row["name"], key, row[key])
    keys = TIME_KEYS + (["compile_fwd", "compile_fwdbwd"] if compiled else [])
    for key in keys:
        t = row["times"][key]
        if t is None:  # a compile failure is reported as n/a, not an error
            assert key.startswith("compile") and row["compile_error"], (row["name"], key)
            continue
        assert _positive_finite(t["median_us"]) and t["reps"] >= 3, (row["name"], key, t)
    assert 0 <= row["err_fwd"] < 1e-5, (row["name"], row["err_fwd"])
    assert 0 <= row["err_grad"] < 1e-4, (row["name"], row["err_grad"])
    assert row["err_eager_fwd"] < 1e-3


def _run(args):
    """(return code, stdout) of the bench's main."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = bench.main(args)
    return rc, buf.getvalue()


def _run_json(args):
    rc, text = _run(args + ["--json", "-"])
    assert rc == 0, text
    return json.loads(text[text.index("\n{") + 1:])


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One CPU run of every default quick shape, torch.compile included:
    (the JSON as loaded, its path, the text report)."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    rc, out = _run(["--quick", "--device", "cpu", "--json", str(path), "--quiet"])
    assert rc == 0, out
    return json.loads(path.read_text()), path, out


# ----------------------------------------------------------- end to end
def test_bench_quick_json(quick_run):
    data, _, out = quick_run
    assert {"env", "timer", "copy", "shapes", "failed", "small", "components", "targets",
            "compile_note", "numpyro_note", "runtime_s", "sanity_ok"} <= set(data)
    env = data["env"]
    for key in ("date", "device", "torch", "build_info", "command_line", "seed"):
        assert key in env
    assert env["device"] == "cpu" and env["build_info"]["version"]
    assert data["timer"]["mode"] == "queued" and data["timer"]["clock"] == "perf_counter"
    assert _positive_finite(data["copy"]["bytes_per_s"])
    assert [r["name"] for r in data["shapes"]] == SHAPES
    for row in data["shapes"]:
        _check_row(row, compiled=True)
    assert _positive_finite(data["small"]["add1"]["median_us"])
    assert _positive_finite(data["small"]["trivial_grad"]["median_us"])
    # The four small-problem timings are interleaved: the same number of calls each.
    reps = {data["small"][k]["reps"] for k in ("add1", "ext_fwd", "trivial_grad", "ext_fwdbwd")}
    assert len(reps) == 1 and reps.pop() >= 1
    targets = {t["id"]: t for t in data["targets"]}
    assert len(targets) == 18
    for t in targets.values():
        if t["id"].startswith(("per_sample", "sparse", "em_")):
            assert t["met"] is None  # not run without --per-sample, --sparse, --em
        else:
            assert isinstance(t["met"], bool) and _positive_finite(t["value"])
    assert data["sanity_ok"] is True
    assert "ext fwd+bwd" in out and "targets" in out and "small problem" in out
    # The GPU targets are shown on a CPU run, not judged there.
    tall = [line for line in out.splitlines()
            if "forward within 1.25x of the floor at tall" in line][0]
    assert "a cuda target, not judged on cpu (this run's value: " in tall
    assert "met" not in tall
    cpu_mid = [line for line in out.splitlines()
               if "forward at least 5x faster than eager at mid" in line][0]
    assert cpu_mid.rstrip().endswith("x)") and ("met (" in cpu_mid)


def test_bench_numpyro_peer_timed_or_skipped_with_a_note(quick_run):
    data, _, out = quick_run
    if NUMPYRO:
        assert data["numpyro_note"] == ""
        for row in data["shapes"]:
            for key in ("numpyro_fwd", "numpyro_fwdbwd"):
                assert _positive_finite(row["times"][key]["median_us"]), (row["name"], key)
            assert row["err_numpyro_fwd"] < 1e-3
    else:
        assert data["numpyro_note"].startswith("NumPyro peer skipped")
        assert data["numpyro_note"] in out
        assert all(r["times"]["numpyro_fwd"] is None for r in data["shapes"])


def test_numpyro_peer_skipped_when_jax_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError
    peer, note = peers.numpyro_peer(torch.device("cpu"))
    assert peer is None and "not importable" in note


def test_bench_extras_markdown():
    rc, out = _run(["--quick", "--device", "cpu", "--no-compile", "--no-numpyro", "--quiet",
                    "--markdown", "--shapes", "seed", "tall=256x16", "extra=64x100:0.1",
                    "--per-sample", "--components", "3", "--components-shape", "64x32",
                    "--seed", "123", "--json", "-"])
    assert rc == 0
    assert "| name | BxV | floor |" in out
    data = json.loads(out[out.index("\n{") + 1:])
    assert data["env"]["seed"] == 123
    assert data["numpyro_note"] == "NumPyro peer skipped (--no-numpyro)"
    names = [r["name"] for r in data["shapes"]]
    assert names == ["seed", "tall", "extra", "tall/per-sample"]
    ps = data["shapes"][-1]
    assert (ps["B"], ps["V"]) == (256, 16)
    for row in data["shapes"]:
        _check_row(row, compiled=False)
        assert row["times"]["compile_fwd"] is None and row["times"]["numpyro_fwd"] is None
    extra = data["shapes"][2]
    assert extra["density"] == 0.1 and 0 < extra["nonzero_fraction"] < 0.5
    comp = data["components"]
    assert (comp["B"], comp["V"], comp["K"]) == (64, 32, 3)
    assert comp["err_fwd"] < 1e-5 and comp["grad_diff_fused_vs_separate"] < 1e-4
    for key in ("fused_fwd", "fused_fwdbwd", "separate_fwd", "separate_fwdbwd"):
        assert _positive_finite(comp["times"][key]["median_us"])
    per_sample = [t for t in data["targets"] if t["id"] == "per_sample_fwd_floor_tall"][0]
    assert isinstance(per_sample["met"], bool)


# --------------------------------------------------------------- timing
@pytest.mark.parametrize("timing", ["queued", "synced"])
def test_bench_timing_option_reaches_the_timer(timing):
    out = _run_json(["--quick", "--device", "cpu", "--no-compile", "--no-numpyro", "--quiet",
                     "--shapes", "seed", "--timing", timing])
    assert out["timer"]["mode"] == timing and out["timer"]["clock"] == "perf_counter"
    assert _positive_finite(out["shapes"][0]["times"]["ext_fwd"]["median_us"])


def test_bench_graph_timing_on_cpu_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--quick", "--device", "cpu", "--timing", "graph", "--quiet"])
    assert e.value.code == 2
    assert "--timing graph" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Timer(torch.device("cpu"), warmup=1, min_reps=1, max_reps=1, min_time=0.0,
              timing="graph")
    with pytest.raises(ValueError, match="timing must be one of"):
        Timer(torch.device("cpu"), warmup=1, min_reps=1, max_reps=1, min_time=0.0,
              timing="async")


class _CountingTimer(Timer):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.syncs = 0

    def sync(self):
        self.syncs += 1
        super().sync()


@pytest.mark.parametrize("timing", ["queued", "synced"])
def test_synced_timing_synchronizes_after_every_call(timing):
    timer = _CountingTimer(torch.device("cpu"), warmup=2, min_reps=30, max_reps=30,
                           min_time=0.0, timing=timing)
    calls = []
    res = timer.paired({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")})
    assert res["a"]["reps"] == res["b"]["reps"] == 30
    assert calls[4:10] == ["a", "b"] * 3  # interleaved after the warm-up
    timed = 2 * 30
    if timing == "synced":
        assert timer.syncs >= timed
    else:
        assert timer.syncs <= 2  # once after the warm-up, none between calls


def test_timer_summary_is_the_median():
    xs = torch.rand(9).tolist()
    s = Timer.summary(xs)
    assert s["median_us"] == sorted(xs)[4] and s["min_us"] == min(xs) and s["reps"] == 9
    assert Timer.summary([4.0, 1.0, 3.0, 2.0])["median_us"] == 2.5


# ---------------------------------------------------------------- cases
def test_default_shapes():
    for kind, shapes in cases.DEFAULT_SHAPES.items():
        assert [s.name for s in shapes] == SHAPES, kind
        assert [s.density is not None for s in shapes] == [False] * 4 + [True], kind
    assert [(s.B, s.V) for s in cases.CUDA_SHAPES] == [
        (512, 256), (8192, 1024), (65536, 1024), (64, 262144), (16384, 16384)]
    assert cases.CUDA_SHAPES[-1].density == cases.SPARSE_DENSITY == 0.01
    assert cases.Shape("x", 3, 4, 0.5).bxv == "3x4:0.5" and cases.Shape("x", 3, 4).bxv == "3x4"


def test_make_counts_and_log_alpha():
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    dense = cases.make_counts(cases.Shape("d", 300, 40), g, torch.device("cpu"))
    assert dense.shape == (300, 40) and dense.dtype == torch.float32
    assert torch.equal(dense, dense.round()) and dense.min() == 0 and dense.max() == 9
    sparse = cases.make_counts(cases.Shape("s", 400, 500, 0.02), g, torch.device("cpu"))
    assert sparse.shape == (400, 500) and sparse.dtype == torch.float32
    nz = sparse[sparse != 0]
    assert 0.015 < nz.numel() / sparse.numel() < 0.025 and nz.min() >= 1
    assert torch.equal(nz, nz.round())
    # Never all zeros, even at a density that would give none.
    tiny = cases.make_counts(cases.Shape("t", 2, 2, 1e-9), g, torch.device("cpu"))
    assert tiny.sum() == 1
    la = cases.make_log_alpha((7, 50), g, torch.device("cpu"))
    assert la.shape == (7, 50) and la.dtype == torch.float32
    assert -2.0 <= la.min() and la.max() <= 3.0 and la.std() > 0.5
    assert cases.l2_bytes(torch.device("cpu")) == 0


def test_parse_shapes():
    shapes = bench.parse_shapes(["seed,mid=8x16", "sparse=10x20", "x=3x4:0.5"],
                                bench.CPU_SHAPES)
    assert [(s.name, s.B, s.V, s.density) for s in shapes] == [
        ("seed", 512, 256, None), ("mid", 8, 16, None), ("sparse", 10, 20, 0.01),
        ("x", 3, 4, 0.5)]
    for bad in (["nope"], ["a=3y4"], ["a=3x4:2"], ["a=0x4"]):
        with pytest.raises(ValueError):
            bench.parse_shapes(bad, bench.CPU_SHAPES)
    assert cases.parse_bxv("64x32") == (64, 32)
    with pytest.raises(ValueError, match="BxV"):
        cases.parse_bxv("64by32")


def test_rotation_defeats_a_cache_of_the_given_size():
    counts = torch.randint(0, 10, (64, 32), dtype=torch.float32)
    nbytes = counts.numel() * 4
    nxt = bench.rotation(counts, cache_bytes=5 * nbytes)  # 15 copies: 3x the cache
    seen = [nxt() for _ in range(31)]
    ptrs = [t.data_ptr() for t in seen]
    assert len(set(ptrs)) == 15 and ptrs[:15] == ptrs[15:30]  # in turn, each once
    assert seen[0] is counts and all(torch.equal(t, counts) for t in seen)
    assert bench.rotation(counts, cache_bytes=0)() is counts  # no cache (CPU)
    many = bench.rotation(counts, cache_bytes=1000 * nbytes)
    assert len({many().data_ptr() for _ in range(200)}) == 64  # at most 64 copies


def test_floor_bytes():
    fwd, fb = peers.floor_bytes(counts_bytes=1000, alpha_numel=10, out_numel=7)
    assert fwd == 1000 + 4 * 10 + 4 * 7 and fb == fwd + 4 * 7 + 4 * 10


# --------------------------------------------------------------- report
def test_report_renders_every_case(quick_run):
    data, _, _ = quick_run
    for markdown in (False, True):
        text = report.report(data, markdown)
        lines = text.splitlines()
        for row in data["shapes"]:
            line = [ln for ln in lines if ln.lstrip("| ").startswith(row["name"] + " ")]
            assert len(line) == 1, (row["name"], markdown)
            assert f"{row['B']}x{row['V']}" in line[0]
        for t in data["targets"]:
            assert t["target"] in text
    md = report.report(data, True).splitlines()
    table = [ln for ln in md if ln.startswith("|")]
    assert len(table) == 2 + len(data["shapes"])
    assert len({ln.count("|") for ln in table}) == 1  # every line has every column


def test_targets_judged_against_their_limits():
    def row(name, fwd, fwdbwd, **kw):
        return {"name": name, "ratio_fwd_floor": fwd, "ratio_fwdbwd_floor": fwdbwd, **kw}
    rows = {"tall": row("tall", 1.2, 2.6), "mid": row("mid", 2.5, 1.0,
                                                       speedup_fwd_vs_eager=6.0,
                                                       speedup_fwdbwd_vs_eager=4.0)}
    got = {t["id"]: t for t in report.evaluate_targets(rows, None, torch.device("cuda"))}
    assert got["fwd_floor_tall"]["met"] is True and got["fwdbwd_floor_tall"]["met"] is False
    assert got["fwd_floor_mid"]["met"] is False and got["fwd_floor_wide"]["met"] is None
    assert got["fwd_add1_seed"]["missing"] == "shape seed not run"
    assert got["cpu_fwd_vs_eager_mid"]["applies"] is False
    cpu = {t["id"]: t for t in report.evaluate_targets(rows, None, torch.device("cpu"))}
    assert cpu["cpu_fwd_vs_eager_mid"]["met"] is True
    assert cpu["cpu_fwdbwd_vs_eager_mid"]["met"] is False
    for t in cpu.values():
        assert "issue" not in t["target"].lower()


# ------------------------------------------------------------------ CLI
def test_cli_parses_the_gpu_check_flags():
    p = cli.build_parser()
    a = p.parse_args(["--per-sample", "--components", "16", "--markdown", "--json", "F"])
    assert (a.per_sample, a.components, a.markdown, a.json) == (True, 16, True, "F")
    a = p.parse_args(["--timing", "graph", "--no-compile", "--markdown", "--quiet"])
    assert (a.timing, a.no_compile, a.quiet, a.json, a.components) == (
        "graph", True, True, None, None)
    a = p.parse_args(["--components", "--json", "--components-shape", "8x4"])
    assert (a.components, a.json, a.components_shape) == (16, "bench.json", (8, 4))
    for bad in (["--timing", "async"], ["--components-shape", "8by4"]):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            p.parse_args(bad)


def test_cli_help_is_clean(capsys):
    from dirmult_ext.cli import main as dirmult_ext_main
    with pytest.raises(SystemExit) as e:
        dirmult_ext_main(["bench", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--timing" in text and "--per-sample" in text and "floor" in text
    for word in ("issue", "DESIGN", "session"):
        assert word not in text


def test_cli_bad_device(capsys):
    assert bench.main(["--device", "tpu", "--quick"]) == 2
    assert "--device" in capsys.readouterr().err


# ----------------------------------------------------------------- plot
def test_plot_series_from_a_bench_json(quick_run):
    data, _, _ = quick_run
    s = plot.series(data)
    assert set(s) == {"fwd", "fwdbwd"}
    for key in ("fwd", "fwdbwd"):
        assert {"dirmult_ext", "eager reference", "floor"} <= set(s[key])
        assert ("NumPyro (jax.jit)" in s[key]) == NUMPYRO
        for i, row in enumerate(data["shapes"]):
            assert s[key]["dirmult_ext"][i] == row["times"][f"ext_{key}"]["median_us"]
            assert s[key]["floor"][i] == row[f"floor_{key}_us"]
    up = plot.series(data, speedup=True)["fwd"]
    assert up["eager reference"] == [1.0] * len(data["shapes"])
    assert up["dirmult_ext"][0] == pytest.approx(data["shapes"][0]["speedup_fwd_vs_eager"])


def test_plot_writes_a_png(quick_run, tmp_path):
    pytest.importorskip("matplotlib")
    _, path, _ = quick_run
    for extra in ([], ["--speedup"]):
        out = tmp_path / f"bench{len(extra)}.png"
        assert plot.main([str(path), str(out)] + extra) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_plot_without_matplotlib_says_so(quick_run, tmp_path, monkeypatch, capsys):
    _, path, _ = quick_run
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert plot.main([str(path), str(tmp_path / "x.png")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_plot_rejects_a_json_that_is_not_a_bench(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as e:
        plot.main([str(other), str(tmp_path / "x.png")])
    assert e.value.code == 2 and "not a dirmult-ext bench JSON" in capsys.readouterr().err


# ----------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs CUDA and the dirmult CUDA kernels")
def test_bench_graph_timing_on_cuda():
    # Every case captured and replayed (ext, eager, the small-problem peers):
    # a call that cannot be captured (a host synchronization) would fail it.
    out = _run_json(["--quick", "--device", "cuda", "--no-compile", "--no-numpyro", "--quiet",
                     "--shapes", "seed", "mid", "--timing", "graph"])
    assert out["timer"]["mode"] == "graph" and out["timer"]["clock"] == "cuda_graph_replay"
    assert not out["failed"]
    assert out["copy"]["timing"] == "queued"  # the floor: the eager copy kernel's bandwidth
    for row in out["shapes"]:
        for key in TIME_KEYS:
            assert _positive_finite(row["times"][key]["median_us"]), (row["name"], key)


# --------------------------------------------------------------- sparse
SPARSE_TIME_KEYS = ["ext_fwd", "ext_fwdbwd", "handwritten_fwd", "handwritten_fwdbwd",
                    "dense_fwd", "dense_fwdbwd"]


def test_bench_sparse_quick_json():
    rc, out = _run(["--sparse", "--quick", "--device", "cpu", "--no-compile", "--no-numpyro",
                    "--quiet", "--markdown", "--json", "-"])
    assert rc == 0, out
    res = json.loads(out[out.index("\n{") + 1:])
    assert res["shapes"] == [] and res["sanity_ok"] is True
    entries = {e["name"]: e for e in res["sparse"]}
    shapes = {s.name: s for s in sparse_cases.SPARSE_SHAPES["quick"]}
    assert set(entries) == set(shapes)
    for name, e in entries.items():
        s = shapes[name]
        assert (e["B"], e["V"], e["density"]) == (s.B, s.V, s.density)
        assert abs(e["nonzero_fraction"] - s.density) < 0.3 * s.density, e
        assert e["floor_bytes"] >= e["nnz"] * 8 and _positive_finite(e["floor_us"])
        for key in SPARSE_TIME_KEYS:
            t = e["times"][key]
            assert _positive_finite(t["median_us"]) and t["reps"] >= 3, (name, key, t)
        for key in ("ratio_fwd_floor", "ratio_fwdbwd_floor", "speedup_fwd_vs_handwritten"):
            assert _positive_finite(e[key]), (name, key)
        assert 0 <= e["err_fwd"] < 1e-5 and 0 <= e["err_grad"] < 1e-4, e
        assert 0 <= e["err_handwritten_fwd"] < 1e-3, e
        assert e["errors"] == {}
    comp = entries["csr_tall"]["components"]
    assert comp["K"] == shapes["csr_tall"].components and _positive_finite(comp["ratio_vs_single"])
    assert 0 <= entries["csr_tall"]["err_components_fwd"] < 1e-5
    targets = {t["id"]: t for t in res["targets"]}
    assert targets["sparse_fwd_csr_floor_csr_tall"]["applies"] is False
    tall = targets["sparse_fwd_csr_floor_csr_tall"]
    assert tall["value"] == entries["csr_tall"]["ratio_fwd_floor"]
    assert "| csr_square |" in out and "| csr_tall |" in out


def test_make_csr_is_a_uniform_csr_matrix():
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    shape = sparse_cases.SparseShape("x", 3000, 700, 0.04)
    sc = sparse_cases.make_csr(shape, g, torch.device("cpu"))
    sc.check_structure()  # offsets from 0 to nnz, columns increasing within rows
    assert sc.crow_indices.dtype == sc.col_indices.dtype == torch.int32
    assert sc.values.dtype == torch.float32
    dense = sc.to_dense().double()
    assert int((dense != 0).sum()) == sc.nnz
    assert abs(sc.nnz / (3000 * 700) - 0.04) < 0.004
    vals = sc.values.double()
    assert bool((vals >= 1).all()) and bool((vals == vals.round()).all())
    assert abs(vals.mean().item() - 4.0) < 0.1  # 1 + Poisson(3)
    # every column about as often nonzero: no edge of the range favoured
    per_col = (dense != 0).sum(0).double()
    assert per_col.min().item() > 0.5 * per_col.mean().item()
    assert per_col.max().item() < 1.5 * per_col.mean().item()


def test_handwritten_sparse_peer_matches_float64():
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    sc = sparse_cases.make_csr(sparse_cases.SparseShape("x", 200, 300, 0.05), g,
                               torch.device("cpu"))
    la = cases.make_log_alpha((300,), g, torch.device("cpu"))
    rows = torch.repeat_interleave(torch.arange(200), sc.crow_indices.diff().long())
    N = torch.zeros(200).index_add_(0, rows, sc.values)
    got = sparse_cases.handwritten(sc.values, sc.col_indices, rows, N, 200, la)
    ref = dirmult_ext.reference_log_lik(sc.to_dense().double(), la.double())
    assert (got.double() - ref).abs().max().item() < 1e-5 * ref.abs().max().item()


def test_sparse_targets_judged_against_their_limits():
    sparse = [{"name": "csr_tall", "ratio_fwd_floor": 1.9, "ratio_fwdbwd_floor": 3.6,
               "components": {"K": 16, "ratio_vs_single": 5.0}},
              {"name": "csr_huge", "error": "OutOfMemoryError: CUDA out of memory"}]
    got = {t["id"]: t for t in report.evaluate_targets({}, None, torch.device("cuda"), sparse)}
    assert got["sparse_fwd_csr_floor_csr_tall"]["met"] is True
    assert got["sparse_fwdbwd_csr_floor_csr_tall"]["met"] is False
    assert got["sparse_components_vs_single_csr_tall"]["met"] is True
    assert got["sparse_fwd_csr_floor_csr_huge"]["met"] is None
    assert "out of memory" in got["sparse_fwd_csr_floor_csr_huge"]["missing"]
    none = {t["id"]: t for t in report.evaluate_targets({}, None, torch.device("cuda"))}
    assert none["sparse_fwd_csr_floor_csr_tall"]["missing"] == "run with --sparse"


def test_sparse_shape_that_fails_is_reported_not_raised(monkeypatch):
    real = sparse_cases.make_csr

    def make_csr(shape, g, device):
        if shape.name == "csr_square":
            raise torch.OutOfMemoryError("out of memory (simulated)")
        return real(shape, g, device)
    monkeypatch.setattr(sparse_cases, "make_csr", make_csr)
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    timer = Timer(torch.device("cpu"), **cli.timer_settings(torch.device("cpu"), True))
    out = sparse_cases.bench_sparse(sparse_cases.SPARSE_SHAPES["quick"], g, torch.device("cpu"),
                                    timer, 1e10, lambda _: None)
    failed, ok = out
    assert "out of memory" in failed["error"] and failed["times"] == {}
    assert ok["err_fwd"] < 1e-5 and ok["times"]["ext_fwd"]["reps"] >= 3
    result = {"shapes": [], "failed": [], "sparse": out}
    assert any("csr_square" in p for p in report.sanity_problems(result))
    assert "n/a (OutOfMemoryError" in report.sparse_table(out, False)


def test_bench_em_iteration():
    out = _run_json(["--quick", "--device", "cpu", "--no-compile", "--no-numpyro", "--quiet",
                     "--em", "3"])
    assert out["shapes"] == [] and not out["failed"]
    em = out["em"]
    assert (em["K"], em["iters"]) == (3, 10) and em["nnz"] > 0
    assert em["on_device"]["n_iter"] == em["iters"]
    fwd = em["times"]["estep_fwd_f64"]["median_us"]
    assert _positive_finite(fwd) and _positive_finite(em["on_device"]["iter_us"])
    assert em["ratio_iter_estep"] == pytest.approx(em["on_device"]["iter_us"] / fwd)
    assert "streamed" not in em                  # (the pinned-memory stream is CUDA's)
    target = {t["id"]: t for t in out["targets"]}
    assert target["em_iter_vs_estep"]["value"] == pytest.approx(em["ratio_iter_estep"])
    assert target["em_streamed_vs_copy"]["missing"] == "streamed on CUDA only"
