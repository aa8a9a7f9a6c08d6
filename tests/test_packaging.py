"""How the package was built and how it loads its native libraries.

Runs everywhere (no GPU needed): build_info() fields, the CPU-only-torch path
and the CUDA-major mismatch message of _ops._load_cuda_kernels, the latter two
by calling the loader function directly with monkeypatched module state (no
module reload, nothing is loaded).
"""
import os
import platform
import re

import pytest
import torch

import dirmult_ext
from dirmult_ext.ops import library as _ops


def test_build_info_fields():
    info = dirmult_ext.build_info()
    for key in ("version", "torch_target_version", "cuda_version", "cuda_architectures",
                "torch", "torch_cuda", "cuda_kernels_loaded", "torch_target", "cpu_simd",
                "cuda_components_way"):
        assert key in info, key
    assert info["version"] == dirmult_ext.__version__
    assert info["torch"] == torch.__version__
    assert info["torch_cuda"] == torch.version.cuda
    # stable-ABI target: 2.10 unless the build asked for another
    assert re.fullmatch(r"2\.\d+", info["torch_target"])
    major, minor = (int(x) for x in info["torch_target"].split("."))
    assert (major, minor) >= (2, 10)
    torch_mm = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    assert torch_mm >= (major, minor), "loaded into a torch older than the target"
    if info["cuda_version"]:
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", info["cuda_version"])
        assert info["cuda_architectures"]
    else:
        assert info["cuda_architectures"] == ""
    assert isinstance(info["cuda_kernels_loaded"], bool)
    assert info["cuda_kernels_loaded"] == _ops.CUDA_KERNELS
    assert info["cuda_components_way"] in _ops.COMPONENTS_WAYS


def test_cuda_kernels_only_with_cuda_torch():
    """The CUDA kernels are loaded exactly where torch has CUDA and the build
    has its library (a CUDA-major mismatch raises on import instead), and
    then every op has a CUDA kernel; otherwise none has."""
    info = dirmult_ext.build_info()
    expected = (torch.version.cuda is not None and bool(info["cuda_version"])
                and (_ops._HERE / "_C_cuda.so").exists())
    assert info["cuda_kernels_loaded"] == expected
    for op in ("log_lik", "log_lik_backward", "log_lik_with_grad", "log_lik_components",
               "log_lik_components_backward", "poch_terms"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"dirmult::{op}", "CUDA") == expected


def test_installed_wheel_is_what_is_tested():
    """scripts/ci/cross_version_test.sh sets DIRMULT_EXPECT_INSTALLED_IN to its
    venv: the package under test must come from there, not from python/."""
    where = os.environ.get("DIRMULT_EXPECT_INSTALLED_IN")
    if not where:
        pytest.skip("not running against an installed wheel")
    assert os.path.realpath(dirmult_ext.__file__).startswith(os.path.realpath(where) + os.sep)


@pytest.fixture
def fake_cuda_lib(tmp_path, monkeypatch):
    """_load_cuda_kernels looking at a folder with a (dummy) _C_cuda.so, with
    torch.ops.load_library recorded instead of called."""
    (tmp_path / "_C_cuda.so").write_bytes(b"")
    monkeypatch.setattr(_ops, "_HERE", tmp_path)
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", lambda path: loaded.append(path))
    return loaded


def test_cpu_only_torch_skips_cuda_library(fake_cuda_lib, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setitem(_ops.BUILD_INFO, "cuda_version", "13.0")
    assert _ops._load_cuda_kernels() is False
    assert fake_cuda_lib == []


def test_no_cuda_library_in_cpu_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(_ops, "_HERE", tmp_path)   # no _C_cuda.so there
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert _ops._load_cuda_kernels() is False


@pytest.mark.parametrize("built, torch_cuda, tag", [("13.0", "12.8", "cu128"),
                                                     ("12.8", "13.0", "cu130")])
def test_cuda_major_mismatch_names_the_wheel(fake_cuda_lib, monkeypatch, built, torch_cuda, tag):
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setitem(_ops.BUILD_INFO, "cuda_version", built)
    with pytest.raises(ImportError) as err:
        _ops._load_cuda_kernels()
    msg = str(err.value)
    assert built in msg and torch_cuda in msg
    assert f"+{tag}" in msg
    assert fake_cuda_lib == []


def test_cuda_major_match_loads(fake_cuda_lib, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.2")
    monkeypatch.setitem(_ops.BUILD_INFO, "cuda_version", "13.0")
    assert _ops._load_cuda_kernels() is True
    assert fake_cuda_lib == [str(_ops._HERE / "_C_cuda.so")]


def test_cpu_simd_matches_the_cpu():
    # The per-sample CPU kernels take their AVX2 path exactly where the CPU
    # has AVX2 and FMA (x86-64; the flags as Linux reports them), unless
    # DIRMULT_CPU_SIMD=none turns it off.
    info = dirmult_ext.build_info()
    assert info["cpu_simd"] in ("avx2", "none")
    if os.environ.get("DIRMULT_CPU_SIMD") == "none" or platform.machine() not in ("x86_64", "AMD64"):
        assert info["cpu_simd"] == "none"
        return
    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    expected = "avx2" if {"avx2", "fma"} <= set(flags) else "none"
    assert info["cpu_simd"] == expected
