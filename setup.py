"""Build dirmult_ext: setuptools' build_ext drives CMake (see CMakeLists.txt).

Environment variables:
  DIRMULT_WITH_CUDA=0|1      build the CUDA kernels when nvcc is found (default 1)
  DIRMULT_CUDA_ARCHS="80;90" CMAKE_CUDA_ARCHITECTURES (default: release set)
  DIRMULT_TORCH_TARGET=0x020a000000000000  oldest torch the build loads into
  DIRMULT_BUILD_JOBS=N       parallel build jobs (default: CPU count)
  CUDACXX=/path/to/nvcc      which CUDA compiler to use
"""
import os
import re
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
VERSION = re.search(r'__version__ = "([^"]+)"',
                    (ROOT / "python/dirmult_ext/_version.py").read_text()).group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import pybind11
        import torch.utils

        extdir = Path(self.get_ext_fullpath(ext.name)).parent.resolve()
        build_temp = Path(self.build_temp).resolve()
        build_temp.mkdir(parents=True, exist_ok=True)
        cfg = "Debug" if self.debug else "Release"
        args = [
            f"-DCMAKE_BUILD_TYPE={cfg}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{pybind11.get_cmake_dir()}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DDIRMULT_OUTPUT_DIR={extdir}",
            f"-DDIRMULT_VERSION={VERSION}",
            f"-DDIRMULT_WITH_CUDA={'OFF' if os.environ.get('DIRMULT_WITH_CUDA', '1') == '0' else 'ON'}",
        ]
        if os.environ.get("DIRMULT_CUDA_ARCHS"):
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={os.environ['DIRMULT_CUDA_ARCHS']}")
        if os.environ.get("DIRMULT_TORCH_TARGET"):
            args.append(f"-DDIRMULT_TORCH_TARGET={os.environ['DIRMULT_TORCH_TARGET']}")
        try:
            import ninja  # noqa: F401
            args.append("-GNinja")
        except ImportError:
            pass
        jobs = os.environ.get("DIRMULT_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_temp, check=True)
        subprocess.run(["cmake", "--build", ".", "--parallel", jobs], cwd=build_temp, check=True)


setup(
    version=VERSION,
    ext_modules=[CMakeExtension("dirmult_ext._C")],
    cmdclass={"build_ext": CMakeBuild},
)
