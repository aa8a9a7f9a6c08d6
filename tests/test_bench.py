"""Smoke tests of ``dirmult-ext bench`` (dirmult_ext.bench) on the CPU, and its graph timing on CUDA."""
import json
import math

import pytest
import torch

import dirmult_ext
from dirmult_ext import bench

SHAPES = ["seed", "mid", "tall", "wide", "sparse"]
TIME_KEYS = ["ext_fwd", "ext_fwdbwd", "eager_fwd", "eager_fwdbwd"]


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


def test_bench_quick_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = bench.main(["--quick", "--device", "cpu", "--json", str(path), "--quiet"])
    assert rc == 0
    data = json.loads(path.read_text())
    assert {"env", "timer", "copy", "shapes", "small", "components", "targets",
            "runtime_s", "sanity_ok"} <= set(data)
    env = data["env"]
    for key in ("date", "device", "torch", "build_info", "command_line", "seed"):
        assert key in env
    assert env["device"] == "cpu" and env["build_info"]["version"]
    assert _positive_finite(data["copy"]["bytes_per_s"])
    assert [r["name"] for r in data["shapes"]] == SHAPES
    for row in data["shapes"]:
        _check_row(row, compiled=True)
    assert _positive_finite(data["small"]["add1"]["median_us"])
    assert _positive_finite(data["small"]["trivial_grad"]["median_us"])
    # The four small-problem timings are interleaved: the same number of calls each.
    reps = {data["small"][k]["reps"] for k in ("add1", "ext_fwd", "trivial_grad", "ext_fwdbwd")}
    assert len(reps) == 1 and reps.pop() >= 1
    targets = {t["target"]: t for t in data["targets"]}
    assert len(targets) == 11
    for t in targets.values():
        if "per-sample" in t["target"]:
            assert t["met"] is None  # not run without --per-sample
        else:
            assert isinstance(t["met"], bool) and _positive_finite(t["value"])
    assert data["sanity_ok"] is True
    out = capsys.readouterr().out
    assert "ext fwd+bwd" in out and "targets" in out and "small problem" in out
    # The GPU targets are shown on a CPU run, not judged there.
    tall = [line for line in out.splitlines() if "forward tall <= 1.25x floor" in line][0]
    assert "a cuda target, not judged on cpu (this run's value: " in tall
    assert "met" not in tall


def test_bench_extras_markdown(capsys):
    rc = bench.main(["--quick", "--device", "cpu", "--no-compile", "--quiet", "--markdown",
                     "--shapes", "seed", "tall=256x16", "extra=64x100:0.1",
                     "--per-sample", "--components", "3", "--components-shape", "64x32",
                     "--seed", "123", "--json", "-"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| name | BxV | floor |" in out
    data = json.loads(out[out.index("\n{") + 1:])
    assert data["env"]["seed"] == 123
    names = [r["name"] for r in data["shapes"]]
    assert names == ["seed", "tall", "extra", "tall/per-sample"]
    ps = data["shapes"][-1]
    assert (ps["B"], ps["V"]) == (256, 16)
    for row in data["shapes"]:
        _check_row(row, compiled=False)
        assert row["times"]["compile_fwd"] is None
    extra = data["shapes"][2]
    assert extra["density"] == 0.1 and 0 < extra["nonzero_fraction"] < 0.5
    comp = data["components"]
    assert (comp["B"], comp["V"], comp["K"]) == (64, 32, 3)
    assert comp["err_fwd"] < 1e-5 and comp["grad_diff_fused_vs_separate"] < 1e-4
    for key in ("fused_fwd", "fused_fwdbwd", "separate_fwd", "separate_fwdbwd"):
        assert _positive_finite(comp["times"][key]["median_us"])
    per_sample = [t for t in data["targets"] if "per-sample" in t["target"]][0]
    assert isinstance(per_sample["met"], bool)


def test_parse_shapes():
    shapes = bench.parse_shapes(["seed,mid=8x16", "sparse=10x20", "x=3x4:0.5"],
                                bench.CPU_SHAPES)
    assert [(s.name, s.B, s.V, s.density) for s in shapes] == [
        ("seed", 512, 256, None), ("mid", 8, 16, None), ("sparse", 10, 20, 0.01),
        ("x", 3, 4, 0.5)]
    for bad in (["nope"], ["a=3y4"], ["a=3x4:2"]):
        with pytest.raises(ValueError):
            bench.parse_shapes(bad, bench.CPU_SHAPES)


def test_rotation_defeats_a_cache_of_the_given_size():
    import torch
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


@pytest.mark.parametrize("timing", ["queued", "synced", "graph"])
def test_bench_timing_option(timing):
    out = json.loads(_run_json(["--quick", "--device", "cpu", "--no-compile", "--quiet",
                                "--shapes", "seed", "--timing", timing]))
    assert out["timer"]["mode"] == "cpu"  # the CUDA modes; the CPU times each call
    assert _positive_finite(out["shapes"][0]["times"]["ext_fwd"]["median_us"])


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs CUDA and the dirmult CUDA kernels")
def test_bench_graph_timing_on_cuda():
    # Every case captured and replayed (ext, eager, the small-problem peers):
    # a call that cannot be captured (a host synchronization) would fail it.
    out = json.loads(_run_json(["--quick", "--device", "cuda", "--no-compile", "--quiet",
                                "--shapes", "seed", "mid", "--timing", "graph"]))
    assert out["timer"]["mode"] == "graph" and not out["failed"]
    assert out["copy"]["timing"] == "queued"  # the floor: the eager copy kernel's bandwidth
    for row in out["shapes"]:
        for key in ("ext_fwd", "ext_fwdbwd", "eager_fwd", "eager_fwdbwd"):
            assert _positive_finite(row["times"][key]["median_us"]), (row["name"], key)
    with pytest.raises(ValueError, match="timing"):
        bench.Timer(torch.device("cuda"), warmup=1, min_reps=1, max_reps=1, min_time=0.0,
                    timing="async")


def _run_json(args):
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert bench.main(args + ["--json", "-"]) == 0
    text = buf.getvalue()
    return text[text.index("\n{") + 1:]
