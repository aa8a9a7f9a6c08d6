"""The CUDA components' choice of way (`components_as_shared_forward` /
`_backward` in src/cuda/component_table_kernels.cuh) is a cost model fitted
to measured timings: its coefficients must be what
scripts/codegen/gen_components_rule.py gets from the data beside it
(scripts/tuning/data/components_crossover_h200.txt), so that a refit on another
GPU starts from the same procedure. Runs on CPU; needs the source tree."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULE = ROOT / "src" / "cuda" / "component_table_kernels.cuh"
FIT = ROOT / "scripts" / "codegen" / "gen_components_rule.py"

pytestmark = pytest.mark.skipif(not (RULE.exists() and FIT.exists()),
                                reason="needs the source tree (src/, scripts/)")

NUMBER = r"\d+(?:\.\d+)?(?:e-?\d+)?"


def cpp_coefficients():
    """The numbers of each cost line of the two rules, in order: the forward's
    shared and fused lines, the backward's shared line, then its fused line's
    two branches (math path, tables)."""
    text = RULE.read_text()
    out = {}
    for name in ("forward", "backward"):
        body = re.search(r"components_as_shared_%s\(.*?\n}\n" % name, text, re.S).group(0)
        shared = re.search(r"const double shared = (.*?);", body, re.S).group(1)
        fused = re.search(r"const double fused = (.*?);", body, re.S).group(1)
        out[f"shared_{name}"] = [float(x) for x in re.findall(NUMBER, shared)]
        if name == "forward":
            out["fused_fwd"] = [float(x) for x in re.findall(NUMBER, fused)]
        else:
            math_part, table_part = fused.split("?")[1].split(":")
            out["fused_bwd_math"] = [float(x) for x in re.findall(NUMBER, math_part)]
            out["fused_bwd_table"] = [float(x) for x in re.findall(NUMBER, table_part)]
    return out


def load_fit():
    spec = importlib.util.spec_from_file_location("fit_components_rule", FIT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rule_coefficients_are_the_fit_of_the_shipped_data():
    fit = load_fit()
    coef = fit.fit_all(fit.read([fit.DEFAULT_DATA]))
    cpp = cpp_coefficients()
    pairs = {"shared_forward": "shared_fwd", "fused_fwd": "fused_fwd",
             "shared_backward": "shared_bwd", "fused_bwd_math": "fused_bwd_math",
             "fused_bwd_table": "fused_bwd_table"}
    for cpp_name, fit_name in pairs.items():
        got, want = cpp[cpp_name], coef[fit_name]
        assert len(got) == len(want), (cpp_name, got, want)
        for g, w in zip(got, want):
            # the C++ keeps two or three significant digits
            assert g == pytest.approx(w, rel=0.01), (cpp_name, got, want)
