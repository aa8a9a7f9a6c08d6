"""Build dirmult_ext: setuptools' build_ext drives CMake (see CMakeLists.txt).

Environment variables:
  DIRMULT_WITH_CUDA=0|1      build the CUDA kernels when nvcc is found (default 1)
  DIRMULT_CUDA_ARCHS="80;90" CMAKE_CUDA_ARCHITECTURES (default: release set)
  DIRMULT_TORCH_TARGET=0x020a000000000000  oldest torch the build loads into
  DIRMULT_BUILD_JOBS=N       parallel build jobs (default: CPU count)
  CUDACXX=/path/to/nvcc      which CUDA compiler to use
  DIRMULT_LOCAL_VERSION=cu130|none  the version's local tag (default: "cuXY0"
                             from nvcc's release when the CUDA kernels are
                             built from a checkout, so the wheel is
                             0.1.0+cu130; none from an sdist or for the sdist)
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
VERSION = re.search(r'__version__ = "([^"]+)"',
                    (ROOT / "python/dirmult_ext/_version.py").read_text()).group(1)


def _find_nvcc():
    """The CUDA compiler CMake will use: CUDACXX, else nvcc on PATH, else
    $CUDA_PATH/bin/nvcc (CMake's own search order). None when DIRMULT_WITH_CUDA=0."""
    if os.environ.get("DIRMULT_WITH_CUDA", "1") == "0":
        return None
    if os.environ.get("CUDACXX"):
        return os.environ["CUDACXX"]
    nvcc = shutil.which("nvcc")
    if nvcc is None and os.environ.get("CUDA_PATH"):
        nvcc = shutil.which("nvcc", path=os.path.join(os.environ["CUDA_PATH"], "bin"))
    return nvcc


def _local_version(nvcc):
    """'cu128' / 'cu130' for a CUDA build, '' for a CPU-only build or an sdist.

    The wheel's local tag names the CUDA toolkit its kernels were built with,
    like torch's own (+cu128, +cu130), so the CUDA variants of one release can
    sit side by side on an index. An sdist carries no tag; nor does a wheel
    built from an sdist (pip checks the built version against the sdist's),
    unless DIRMULT_LOCAL_VERSION asks for one.
    """
    tag = os.environ.get("DIRMULT_LOCAL_VERSION")
    if tag is not None:
        return "" if tag.lower() in ("", "none", "0") else tag
    if "sdist" in sys.argv or (ROOT / "PKG-INFO").exists() or nvcc is None:
        return ""
    try:
        out = subprocess.run([*shlex.split(nvcc), "--version"], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""
    m = re.search(r"release (\d+)\.(\d+)", out)
    return f"cu{m.group(1)}{m.group(2)}" if m else ""


NVCC = _find_nvcc()
LOCAL_VERSION = _local_version(NVCC)


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
            # RUNPATH: torch's lib folder next to ours in site-packages, not the
            # build machine's absolute torch path (which would leak into the
            # wheel; the libraries sit in dirmult_ext/ops/). torch is imported first anyway, so its libraries are
            # already loaded and matched by SONAME; this covers loading the
            # libraries on their own (torch.ops.load_library).
            "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
            "-DCMAKE_INSTALL_RPATH=$ORIGIN/../../torch/lib",
        ]
        if NVCC and not os.environ.get("CUDACXX"):
            # The compiler the local version tag was read from (CMake reads
            # CUDACXX itself, arguments included).
            args.append(f"-DCMAKE_CUDA_COMPILER={NVCC}")
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
        self._cmake_output_dir = extdir
        # pip shows this (and CMake's "dirmult:" lines, then one line per
        # compiled file) with -v; without it, the build is one spinner.
        print("dirmult_ext: building the C++ ops" + (f" and CUDA kernels (nvcc {NVCC})" if NVCC
              else " (CPU only)") + f" with CMake in {build_temp}, {jobs} parallel jobs",
              file=sys.stderr, flush=True)
        subprocess.run(["cmake", str(ROOT), *args], cwd=build_temp, check=True)
        subprocess.run(["cmake", "--build", ".", "--parallel", jobs], cwd=build_temp, check=True)

    def copy_extensions_to_source(self):
        # In-place builds: setuptools copies _C; the CUDA library rides along.
        super().copy_extensions_to_source()
        built = Path(getattr(self, "_cmake_output_dir", "")) / "_C_cuda.so"
        dest = ROOT / "python" / "dirmult_ext" / "ops" / built.name
        if built.is_file():
            self.copy_file(str(built), str(dest), level=self.verbose)
        elif dest.exists():  # a CPU-only rebuild must not keep a stale CUDA library
            dest.unlink()


setup(
    version=f"{VERSION}+{LOCAL_VERSION}" if LOCAL_VERSION else VERSION,
    ext_modules=[CMakeExtension("dirmult_ext.ops._C")],
    cmdclass={"build_ext": CMakeBuild},
)
