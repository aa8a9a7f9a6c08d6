"""Bad input gets a clear error naming the argument, or (without
validation) a NaN for the affected rows; never a crash or a silent number."""
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import dirmult_ext
from dirmult_ext.ops import checks as _checks, library as _ops

from conftest import DEVICES

from reference import random_counts


def test_wrong_ndim(device):
    with pytest.raises(ValueError, match="counts must have shape"):
        dirmult_ext.log_lik(torch.tensor(3.0, device=device), torch.zeros(1, device=device))


def test_mismatched_categories(device):
    with pytest.raises(ValueError, match=r"log_alpha must have shape \(5,\)"):
        dirmult_ext.log_lik(torch.ones(3, 5, device=device), torch.zeros(4, device=device))
    with pytest.raises(ValueError, match="alpha must have shape"):
        dirmult_ext.log_lik(torch.ones(3, 5, device=device), alpha=torch.ones(2, 5, device=device))
    with pytest.raises(ValueError, match=r"log_alpha must be \(K, 5\)"):
        dirmult_ext.log_lik_components(torch.ones(3, 5, device=device), torch.zeros(2, 4, device=device))


def test_unsupported_dtypes(device):
    with pytest.raises(ValueError, match="counts must have dtype"):
        dirmult_ext.log_lik(torch.ones(2, 3, dtype=torch.bool, device=device), torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="log_alpha must be a floating-point"):
        dirmult_ext.log_lik(torch.ones(2, 3, device=device), torch.zeros(3, dtype=torch.int64, device=device))


def test_argument_choice():
    with pytest.raises(ValueError, match="exactly one of log_alpha and alpha"):
        dirmult_ext.log_lik(torch.ones(2, 3))
    with pytest.raises(ValueError, match="exactly one of log_alpha and alpha"):
        dirmult_ext.log_lik(torch.ones(2, 3), torch.zeros(3), alpha=torch.ones(3))
    with pytest.raises(TypeError, match="counts must be a torch.Tensor"):
        dirmult_ext.log_lik([[1.0, 2.0]], torch.zeros(2))


# Every argument error of every op, called directly (as TorchScript,
# torch.compile's and export's code and C++ callers do): (op, arguments as
# code over the device d, what the message says). The C++ checks
# (src/common/tensor_checks.h) and their Python twins in _checks.py, which
# run in front of the kernels where a C++ error would crash (torch < 2.13,
# or DIRMULT_OP_CHECKS=python; see Note [Stable ABI errors]), raise
# RuntimeError with the same message.
OP_ERRORS = {
    "log_lik 0-d counts": ("log_lik", "torch.tensor(3.0, device=d), torch.zeros(1, device=d), False",
                           "counts must have at least 1 dimension"),
    "log_lik bool counts": ("log_lik", "torch.ones(3, 5, dtype=torch.bool, device=d), "
                            "torch.zeros(5, device=d), False", "counts must be float32, float64"),
    "log_lik complex counts": ("log_lik", "torch.ones(3, 5, dtype=torch.complex64, device=d), "
                               "torch.zeros(5, device=d), False", "counts must be float32, float64"),
    "log_lik half log_alpha": ("log_lik", "torch.ones(3, 5, device=d), "
                               "torch.zeros(5, dtype=torch.float16, device=d), False",
                               "log_alpha must be float32 or float64"),
    "log_lik V mismatch": ("log_lik", "torch.ones(3, 5, device=d), torch.zeros(4, device=d), False",
                           "log_alpha has 4 categories but counts has V=5"),
    "log_lik per-sample rank": ("log_lik", "torch.ones(3, 5, device=d), torch.zeros(2, 3, 5, device=d), "
                                "True", r"log_alpha must be \(V,\) or have counts' shape"),
    "log_lik per-sample shape": ("log_lik", "torch.ones(3, 5, device=d), torch.zeros(2, 5, device=d), "
                                 "False", "mismatch at dim 0: 2 vs 3"),
    "log_lik device": ("log_lik", "torch.ones(3, 5, device=d), torch.zeros(5), False",
                       "counts and log_alpha must be on the same device"),
    "with_grad per-sample": ("log_lik_with_grad", "torch.ones(40, 8, device=d), "
                             "torch.zeros(40, 8, device=d), False", "shared by all rows"),
    "with_grad V mismatch": ("log_lik_with_grad", "torch.ones(40, 8, device=d), "
                             "torch.zeros(9, device=d), False",
                             "log_alpha has 9 categories but counts has V=8"),
    "with_grad dtype": ("log_lik_with_grad", "torch.ones(40, 8, dtype=torch.bool, device=d), "
                        "torch.zeros(8, device=d), False", "counts must be float32, float64"),
    "backward grad shape": ("log_lik_backward", "torch.ones(2, device=d), torch.ones(3, 5, device=d), "
                            "torch.zeros(5, device=d), False, False", "grad must have counts' batch shape"),
    "backward grad dtype": ("log_lik_backward", "torch.ones(3, dtype=torch.float64, device=d), "
                            "torch.ones(3, 5, device=d), torch.zeros(5, device=d), False, True",
                            "grad must have log_alpha's dtype"),
    "backward V mismatch": ("log_lik_backward", "torch.ones(3, device=d), torch.ones(3, 5, device=d), "
                            "torch.zeros(6, device=d), True, False",
                            "log_alpha has 6 categories but counts has V=5"),
    "backward grad device": ("log_lik_backward", "torch.ones(3), torch.ones(3, 5, device=d), "
                             "torch.zeros(5, device=d), False, False",
                             "grad and counts must be on the same device"),
    "components counts rank": ("log_lik_components", "torch.ones(2, 3, 5, device=d), "
                               "torch.zeros(4, 5, device=d), False", r"counts must be \(B, V\)"),
    "components log_alpha rank": ("log_lik_components", "torch.ones(3, 5, device=d), "
                                  "torch.zeros(5, device=d), False", r"log_alpha must be \(K, V\)"),
    "components V mismatch": ("log_lik_components", "torch.ones(3, 5, device=d), "
                              "torch.zeros(2, 4, device=d), True",
                              "log_alpha has 4 categories but counts has V=5"),
    "components dtype": ("log_lik_components", "torch.ones(3, 5, device=d), "
                         "torch.zeros(2, 5, dtype=torch.int64, device=d), False",
                         "log_alpha must be float32 or float64"),
    "components device": ("log_lik_components", "torch.ones(3, 5, device=d), torch.zeros(2, 5), False",
                          "counts and log_alpha must be on the same device"),
    "components_backward grad shape": ("log_lik_components_backward", "torch.ones(3, 3, device=d), "
                                       "torch.ones(3, 5, device=d), torch.zeros(2, 5, device=d)",
                                       r"grad must be \(B, K\)"),
    "components_backward grad dtype": ("log_lik_components_backward",
                                       "torch.ones(3, 2, dtype=torch.float64, device=d), "
                                       "torch.ones(3, 5, device=d), torch.zeros(2, 5, device=d)",
                                       "grad must have log_alpha's dtype"),
    "components_backward K/V": ("log_lik_components_backward", "torch.ones(3, 2, device=d), "
                                "torch.ones(3, 5, device=d), torch.zeros(2, 6, device=d)",
                                "log_alpha has 6 categories but counts has V=5"),
    "poch_terms sizes": ("poch_terms", "torch.zeros(3, device=d), torch.zeros(4, device=d)",
                         "and n of one size"),
    "poch_terms dtype": ("poch_terms", "torch.zeros(3, device=d), "
                         "torch.zeros(3, dtype=torch.float64, device=d)",
                         "poch_terms takes float32/float64 log_alpha and n of one dtype"),
    "poch_terms device": ("poch_terms", "torch.zeros(3, device=d), torch.zeros(3)",
                          "must be on the same device"),
    "tpoch_terms sizes": ("tpoch_terms", "torch.zeros(3, device=d), torch.zeros(4, device=d)",
                          "tpoch_terms needs log_alpha and n of one size"),
    "csr values dtype": ("log_lik_csr", "torch.tensor([0, 1, 2], device=d), "
                         "torch.tensor([0, 1], device=d), "
                         "torch.ones(2, dtype=torch.float16, device=d), torch.zeros(3, device=d), "
                         "False", "values must be float32 or float64"),
    "csr index dtypes": ("log_lik_csr", "torch.tensor([0, 1, 2], device=d), "
                         "torch.tensor([0, 1], dtype=torch.int32, device=d), "
                         "torch.ones(2, device=d), torch.zeros(3, device=d), False",
                         "crow_indices and col_indices must both be int32 or both int64"),
    "csr lengths": ("log_lik_csr", "torch.tensor([0, 1, 2], device=d), "
                    "torch.tensor([0, 1], device=d), torch.ones(3, device=d), "
                    "torch.zeros(3, device=d), False",
                    "col_indices and values must have the same length"),
    "csr log_alpha rank": ("log_lik_csr", "torch.tensor([0, 1, 2], device=d), "
                           "torch.tensor([0, 1], device=d), torch.ones(2, device=d), "
                           "torch.zeros(1, 2, 3, device=d), False",
                           "log_alpha must be .V,. or .K, V. with CSR counts"),
    "csr_backward grad shape": ("log_lik_csr_backward", "torch.zeros(3, device=d), "
                                "torch.tensor([0, 1, 2], device=d), torch.ones(2, device=d), "
                                "torch.tensor([0, 1, 2, 2], device=d), "
                                "torch.tensor([0, 1], device=d), torch.ones(2, device=d), "
                                "torch.zeros(3, device=d)",
                                "grad must be .B,. for .V,. log_alpha"),
    "csr_with_grad log_alpha rank": ("log_lik_csr_with_grad", "torch.tensor([0, 1, 2], device=d), "
                                     "torch.tensor([0, 1], device=d), torch.ones(2, device=d), "
                                     "torch.zeros(2, 3, device=d), False",
                                     "log_lik_csr_with_grad takes log_alpha of shape .V,."),
    "regression counts rank": ("log_lik_regression", "torch.ones(3, 5, 2, device=d), "
                               "torch.zeros(3, 2, device=d), torch.zeros(2, 5, device=d), "
                               "torch.zeros(5, device=d), False",
                               r"counts must be \(B, V\) for log_lik_regression"),
    "regression X dtype": ("log_lik_regression", "torch.ones(3, 5, device=d), "
                           "torch.zeros(3, 2, dtype=torch.int64, device=d), "
                           "torch.zeros(2, 5, device=d), torch.zeros(5, device=d), False",
                           "X must be float32 or float64"),
    "regression P mismatch": ("log_lik_regression", "torch.ones(3, 5, device=d), "
                              "torch.zeros(3, 2, device=d), torch.zeros(4, 5, device=d), "
                              "torch.zeros(5, device=d), False",
                              "W has 4 rows but X has P=2 columns"),
    "regression V mismatch": ("log_lik_regression", "torch.ones(3, 5, device=d), "
                              "torch.zeros(3, 2, device=d), torch.zeros(2, 6, device=d), "
                              "torch.zeros(5, device=d), False",
                              "W has 6 columns but counts has V=5"),
    "regression bias shape": ("log_lik_regression", "torch.ones(3, 5, device=d), "
                              "torch.zeros(3, 2, device=d), torch.zeros(2, 5, device=d), "
                              "torch.zeros(4, device=d), True", r"bias must be \(V,\) with V=5"),
    "regression_backward grad shape": ("log_lik_regression_backward", "torch.ones(2, device=d), "
                                       "torch.ones(3, 5, device=d), torch.zeros(3, 2, device=d), "
                                       "torch.zeros(2, 5, device=d), torch.zeros(5, device=d), "
                                       "False", r"grad must be \(B,\) with B=3"),
    "regression device": ("log_lik_regression", "torch.ones(3, 5, device=d), "
                          "torch.zeros(3, 2, device=d), torch.zeros(2, 5), "
                          "torch.zeros(5, device=d), False",
                          "counts and W must be on the same device"),
    "csr device": ("log_lik_csr", "torch.tensor([0, 1, 2], device=d), "
                   "torch.tensor([0, 1], device=d), torch.ones(2), torch.zeros(3, device=d), "
                   "False", "must be on the same device"),
}
# The device cases need a second device: on CUDA only.
OP_ERROR_CASES = [(torch.device(d), name) for d in DEVICES for name in OP_ERRORS
                  if d == "cuda" or not name.endswith("device")]


@pytest.mark.parametrize("device, op_error", OP_ERROR_CASES, ids=str)
@pytest.mark.skipif(not _ops.STABLE_ABI_ERRORS_RAISE,
                    reason="this torch crashes on C++ errors raised in stable-ABI kernels; "
                           "its Python checks are tested by test_python_op_checks")
def test_direct_op_errors_name_the_problem(device, op_error):
    """In this process: the checks active here (C++ alone on torch >= 2.13),
    and the Python twin of the C++ check, called on its own."""
    op, args, message = OP_ERRORS[op_error]
    args = eval(f"({args},)", {"torch": torch, "d": device})
    with pytest.raises(RuntimeError, match=message):
        getattr(torch.ops.dirmult, op)(*args)
    with pytest.raises(RuntimeError, match=message):
        _checks.OP_CHECKS[op](*args)


# The child: every case of a device (JSON on stdin), the op called in eager
# mode and from a scripted function, each outcome printed as one JSON line;
# a crash shows as the process's exit code.
_CHILD = r"""
import json, sys
import torch, dirmult_ext
from dirmult_ext.ops import library as _ops
assert _ops.OP_CHECKS == "python", _ops.OP_CHECKS
device = sys.argv[1]
for name, op, args_code in json.loads(sys.stdin.read()):
    args = eval(f"({args_code},)", {"torch": torch, "d": torch.device(device)})
    types = ", ".join(f"a{i}: {'bool' if isinstance(a, bool) else 'Tensor'}"
                      for i, a in enumerate(args))
    names = ", ".join(f"a{i}" for i in range(len(args)))
    unit = torch.jit.CompilationUnit(
        f"def f({types}):\n    return torch.ops.dirmult.{op}({names})\n")
    def run(label, f):
        try:
            f()
            print(json.dumps([name, label, None, ""]))
        except Exception as e:
            print(json.dumps([name, label, type(e).__name__, str(e)]))
        sys.stdout.flush()
    run("eager", lambda: getattr(torch.ops.dirmult, op)(*args))
    run("torchscript", lambda: unit.f(*args))
"""


def _child_env(setting):
    return dict(os.environ, DIRMULT_OP_CHECKS=setting)


_PYTHON_CHECK_RESULTS = {}


def _python_check_results(device):
    """Every case of a device in one process (an import each would take most
    of the suite's time): {case: [(label, error type, message), ...]}; a
    crash shows as the exit code and the cases it left unreported."""
    if device.type not in _PYTHON_CHECK_RESULTS:
        cases = [(name, op, args) for d, name in OP_ERROR_CASES if d == device
                 for op, args, _ in [OP_ERRORS[name]]]
        p = subprocess.run([sys.executable, "-c", _CHILD, str(device)], input=json.dumps(cases),
                           env=_child_env("python"), capture_output=True, text=True,
                           timeout=600)
        results = {}
        for line in p.stdout.splitlines():
            name, label, kind, text = json.loads(line)
            results.setdefault(name, []).append((label, kind, text))
        _PYTHON_CHECK_RESULTS[device.type] = (p.returncode, p.stderr[-2000:], results)
    return _PYTHON_CHECK_RESULTS[device.type]


@pytest.mark.parametrize("device, op_error", OP_ERROR_CASES, ids=str)
def test_python_op_checks(device, op_error):
    """DIRMULT_OP_CHECKS=python (on every torch): each case, in eager mode
    and from TorchScript, raises RuntimeError with the message, and the
    process (one for all cases of the device) ends normally."""
    _, _, message = OP_ERRORS[op_error]
    returncode, stderr, results = _python_check_results(device)
    assert returncode == 0, (returncode, stderr)
    got = results.get(op_error, [])
    assert [r[0] for r in got] == ["eager", "torchscript"], got
    for label, kind, text in got:
        assert kind == "RuntimeError", (label, kind, text)
        assert re.search(message, text), (label, text)


_CHILD_TRACED = r"""
import io, sys, torch, dirmult_ext
from dirmult_ext.ops import library as _ops
assert _ops.OP_CHECKS == "python"
d = torch.device(sys.argv[1])
counts, bad = torch.ones(3, 6, device=d), torch.zeros(5, device=d)
class Direct(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.log_alpha = torch.nn.Parameter(bad.clone())
    def forward(self, c):
        return torch.ops.dirmult.log_lik(c, self.log_alpha, False)
def expect(label, f):
    try:
        f()
    except RuntimeError as e:
        assert "log_alpha has 5 categories but counts has V=6" in str(e), (label, str(e)[:500])
        print(label, "raised")
        return
    raise AssertionError(label + " did not raise")
scripted = torch.jit.script(Direct())
buf = io.BytesIO()
torch.jit.save(scripted, buf)
buf.seek(0)
loaded = torch.jit.load(buf, map_location=d)
expect("torchscript module", lambda: scripted(counts))
expect("saved and loaded", lambda: loaded(counts))
with torch.inference_mode():
    expect("inference mode", lambda: loaded(counts))
compiled = torch.compile(lambda c, la: torch.ops.dirmult.log_lik(c, la, False) * 2, fullgraph=True)
expect("torch.compile", lambda: compiled(counts, bad))
program = torch.export.export(Direct(), (counts,))
expect("export", lambda: program.module()(counts))
meta = torch.ops.dirmult.log_lik(counts.to("meta"), torch.zeros(6, device="meta"), False)
assert meta.shape == (3,) and meta.device.type == "meta"
print("meta ok")
"""


def test_python_op_checks_reached_from_traced_code(device, tmp_path):
    """The checks sit below TorchScript (scripted, saved and loaded, under
    inference mode), torch.compile's generated code and an exported program;
    tracing itself (fake tensors) and meta tensors reach the fake kernels."""
    script = tmp_path / "traced.py"  # (torch.jit.script reads the module's source)
    script.write_text(_CHILD_TRACED)
    p = subprocess.run([sys.executable, str(script), str(device)],
                       env=_child_env("python"), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    for label in ("torchscript module", "saved and loaded", "inference mode", "torch.compile",
                  "export"):
        assert f"{label} raised" in p.stdout, p.stdout
    assert "meta ok" in p.stdout


@pytest.mark.parametrize("value", ["Python", "on"])
def test_op_checks_setting_is_checked_on_import(value):
    p = subprocess.run([sys.executable, "-c", "import dirmult_ext"], env=_child_env(value),
                       capture_output=True, text=True)
    assert p.returncode != 0
    assert "ValueError: DIRMULT_OP_CHECKS must be one of auto, python, native" in p.stderr, p.stderr


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="needs a CUDA device (runs in scripts/gpu/gpu_check.sh)")
def test_device_mismatch():
    with pytest.raises(ValueError, match="same device"):
        dirmult_ext.log_lik(torch.ones(2, 3, device="cuda"), torch.zeros(3))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_counts_give_nan_rows(device, bad):
    counts = random_counts((4, 7), torch.float32, device)
    counts[2, 3] = bad
    la = torch.randn(7, device=device, requires_grad=True)
    out = dirmult_ext.log_lik(counts, la)
    assert torch.isnan(out[2]) and torch.isfinite(out[[0, 1, 3]]).all()
    # the gradient does not pretend the bad row was fine
    g, = torch.autograd.grad(out.sum(), la)
    assert torch.isnan(g).all()
    with pytest.raises(ValueError, match="counts contains"):
        dirmult_ext.log_lik(counts, la, validate=True)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_log_alpha(device, bad):
    counts = random_counts((4, 7), torch.float32, device)
    la = torch.randn(7, device=device)
    la[1] = bad
    assert torch.isnan(dirmult_ext.log_lik(counts, la)).all()
    la_ps = torch.randn(4, 7, device=device)
    la_ps[3, 2] = bad
    out = dirmult_ext.log_lik(counts, la_ps)
    assert torch.isnan(out[3]) and torch.isfinite(out[:3]).all()
    comp = torch.randn(3, 7, device=device)
    comp[1, 0] = bad
    out = dirmult_ext.log_lik_components(counts, comp)
    assert torch.isnan(out[:, 1]).all() and torch.isfinite(out[:, [0, 2]]).all()
    with pytest.raises(ValueError, match="log_alpha contains NaN or infinite"):
        dirmult_ext.log_lik(counts, la, validate=True)


def test_bad_counts_in_components(device):
    counts = random_counts((4, 7), torch.float32, device)
    counts[1, 1] = -2
    out = dirmult_ext.log_lik_components(counts, torch.randn(3, 7, device=device))
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2, 3]]).all()


def test_module_checks_categories():
    model = dirmult_ext.DirichletMultinomialLogLik(5)
    with pytest.raises(ValueError, match="num_categories"):
        model(torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"init_log_alpha must have shape \(5,\)"):
        dirmult_ext.DirichletMultinomialLogLik(5, torch.zeros(4))


@pytest.mark.parametrize("B", [3, 40])  # 40 rows: the lookup-table kernels
def test_empty_rows_are_nan_with_a_bad_concentration(device, B):
    """An empty row's log-likelihood is 0 for valid alpha, and NaN (not 0)
    when a concentration is not finite, like every other row."""
    counts = torch.zeros(B, 9, device=device)
    counts[1:, 2] = 4.0
    la = torch.randn(9, device=device)
    assert dirmult_ext.log_lik(counts, la)[0] == 0
    la[5] = math.inf
    assert torch.isnan(dirmult_ext.log_lik(counts, la)).all()
    comp = torch.randn(3, 9, device=device)
    comp[2, 0] = math.nan
    out = dirmult_ext.log_lik_components(counts, comp)
    assert torch.isnan(out[:, 2]).all() and (out[0, :2] == 0).all()


# DIRMULT_CUDA_COMPONENTS, the switch that forces a CUDA components way, is
# checked when the package is imported (a process of its own: the value is
# read once) and reported by build_info; a bad value names the variable and
# the values it takes.
@pytest.mark.parametrize("value, ok", [("fused", True), ("per_component", True), ("auto", True),
                                       ("", True), ("Fused", False), ("both", False)])
def test_components_way_setting_is_checked_on_import(value, ok):
    env = dict(os.environ, DIRMULT_CUDA_COMPONENTS=value)
    p = subprocess.run([sys.executable, "-c",
                        "import dirmult_ext; print(dirmult_ext.build_info()['cuda_components_way'])"],
                       env=env, capture_output=True, text=True)
    if ok:
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == (value or "auto")
    else:
        assert p.returncode != 0
        assert ("ValueError: DIRMULT_CUDA_COMPONENTS must be one of auto, fused, per_component"
                in p.stderr), p.stderr
