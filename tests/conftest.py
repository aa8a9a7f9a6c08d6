"""Shared fixtures. Tests import the installed dirmult_ext (or the in-place
build with PYTHONPATH=python); nothing here edits sys.path."""
import os

import pytest
import torch

# The suite tests the CUDA components' measured rule (the tests of the long
# rows' way expect it); the forced ways are tested in processes of their own
# (test_cuda_forced_components_way). Dropped before the package reads it.
os.environ.pop("DIRMULT_CUDA_COMPONENTS", None)

import dirmult_ext  # noqa: E402


def available_devices():
    devices = ["cpu"]
    if torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS:
        devices.append("cuda")
    return devices


DEVICES = available_devices()


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def pytest_report_header(config):
    info = dirmult_ext.build_info()
    return (f"dirmult_ext {info['version']}: torch {info['torch']}, CUDA build "
            f"{info['cuda_version'] or 'none'} [{info['cuda_architectures']}], "
            f"devices under test: {', '.join(DEVICES)}")


def pytest_terminal_summary(terminalreporter):
    """One line per reason for the skipped tests (most need a GPU), so that
    a run's skips explain themselves without ``-rs``."""
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    for reason, n in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{n} skipped: {reason}")
