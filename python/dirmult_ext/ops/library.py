"""The native libraries and the settings read once on import.

``_C`` (a pybind11 module beside this file) holds the op schemas, the CPU
kernels and the build's description; ``_C_cuda.so`` holds the CUDA kernels
and is loaded only when this torch has CUDA. Where a C++ error would not
reach Python, the argument checks of :mod:`.checks` are registered in front
of the kernels (See Note [Stable ABI errors]).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from . import checks, dispatch
from ._C import build_info as _build_info

__all__ = ["BUILD_INFO", "CUDA_KERNELS", "COMPONENTS_WAY", "COMPONENTS_WAYS", "OP_CHECKS",
           "OP_CHECKS_SETTINGS", "STABLE_ABI_ERRORS_RAISE", "ops"]

_HERE = Path(__file__).resolve().parent
BUILD_INFO: dict = dict(_build_info())


def _cuda_major(version: str) -> str:
    return version.split(".")[0] if version else ""


# The released CUDA variants, by the CUDA major version of torch.
_WHEEL_VARIANTS = {"12": "+cu128", "13": "+cu130"}


def _load_cuda_kernels() -> bool:
    lib = _HERE / "_C_cuda.so"
    if torch.version.cuda is None or not lib.exists():
        return False
    built = BUILD_INFO["cuda_version"]
    if not built:  # a CPU-only build; a stray library is not ours to load
        return False
    if _cuda_major(built) != _cuda_major(torch.version.cuda):
        tag = _WHEEL_VARIANTS.get(_cuda_major(torch.version.cuda),
                                  "+cu" + torch.version.cuda.replace(".", ""))
        raise ImportError(
            f"dirmult_ext was built for CUDA {built} but this torch uses CUDA "
            f"{torch.version.cuda}. Install the dirmult_ext wheel for your torch's CUDA, "
            f"'dirmult_ext==<version>{tag}' (see docs/install.md), or build from "
            "source against this torch.")
    torch.ops.load_library(str(lib))
    return True


# The ways float32 log_lik_components may be forced to take on CUDA
# (src/cuda/policy.cu reads the variable once per process and raises on
# other values too; checked here on import as well, where the error surely
# reaches Python: see Note [Stable ABI errors]).
COMPONENTS_WAYS = ("auto", "fused", "per_component")


def _components_way() -> str:
    way = os.environ.get("DIRMULT_CUDA_COMPONENTS", "")
    if way and way not in COMPONENTS_WAYS:
        raise ValueError(f"DIRMULT_CUDA_COMPONENTS must be one of {', '.join(COMPONENTS_WAYS)} "
                         f"(or unset), got {way!r}")
    return way or "auto"


COMPONENTS_WAY = _components_way()
CUDA_KERNELS = _load_cuda_kernels()
ops = torch.ops.dirmult


# --------------------------------------------------- argument checks in Python
# See Note [Stable ABI errors]. DIRMULT_OP_CHECKS, read once on import:
# "auto" (or unset): the checks of checks.py run in front of every op's
# kernels on torch < 2.13, whose stable ABI turns a C++ error into a crash;
# "python": on every torch (how CI exercises them on a newer torch);
# "native": never (only the C++ checks: a bad argument crashes torch < 2.13).
OP_CHECKS_SETTINGS = ("auto", "python", "native")
STABLE_ABI_ERRORS_RAISE = torch.torch_version.TorchVersion(torch.__version__) >= (2, 13)


def _op_checks_setting() -> str:
    value = os.environ.get("DIRMULT_OP_CHECKS", "")
    if value and value not in OP_CHECKS_SETTINGS:
        raise ValueError(f"DIRMULT_OP_CHECKS must be one of {', '.join(OP_CHECKS_SETTINGS)} "
                         f"(or unset), got {value!r}")
    if value in ("", "auto"):
        return "native" if STABLE_ABI_ERRORS_RAISE else "python"
    return value


OP_CHECKS = _op_checks_setting()


def _register_op_checks():
    # BackendSelect is in every call's key set and sits just above the CPU,
    # CUDA and Meta kernels: TorchScript, torch.compile's and export's code
    # and C++ callers pass it; fake tensors are served above it (their
    # Python key), so tracing never runs the checks; the eager fast path
    # calls the kernels directly, past it.
    lib = torch.library.Library("dirmult", "IMPL")
    for name, check in checks.OP_CHECKS.items():
        lib.impl(name, dispatch.checked_kernel(getattr(ops, name).default, check), "BackendSelect",
                 with_keyset=True)
    return lib


_OP_CHECKS_LIBRARY = _register_op_checks() if OP_CHECKS == "python" else None
dispatch.past_checks(OP_CHECKS == "python")
