"""Shared fixtures. Tests import the installed dirmult_ext (or the in-place
build with PYTHONPATH=python); nothing here edits sys.path."""
import pytest
import torch

import dirmult_ext


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
