#!/usr/bin/env bash
# Prove that dirmult_ext's CUDA sources compile and link with a CUDA 12.x nvcc
# (the +cu128 release variant), on a machine whose own toolkit is CUDA 13.
#
#   scripts/ci/check_cuda12_build.sh          # sm_90; CUDA12_ARCHS="80;90" for more
#
# Where nvcc 12 comes from. NVIDIA's pip packages for CUDA 12 cannot compile a
# .cu file: every nvidia-cuda-nvcc-cu12 wheel on the package index (12.0.76
# ... 12.9.86; re-checked for 12.8.61, 12.8.93, 12.9.41 and 12.9.86) holds only
# bin/ptxas, nvvm/lib64/libnvvm.so, nvvm/libdevice and include/crt -- no
# bin/nvcc (the driver), nvcc.profile, nvvm/bin/cicc, cudafe++, fatbinary,
# nvlink or crt/link.stub. Its companions do not fill the gap:
# nvidia-cuda-runtime-cu12 has only the headers and libcudart(_static),
# nvidia-cuda-cccl-cu12 only CUB/Thrust/libcu++, nvidia-nvfatbin-cu12 only a
# library, cuda-toolkit[nvcc] just pulls nvidia-cuda-nvcc-cu12, and the
# packages that do ship those binaries (nvidia-cuda-nvcc, nvidia-nvvm,
# nvidia-cuda-crt) start at 13.0. Step 1 re-checks this file by file for the
# 12.9 and 12.8 series each run, so a future wheel that carries the compiler
# is noticed.
# So the toolkit is taken from Debian's archive instead: the
# nvidia-cuda-toolkit / nvidia-cuda-dev packages of the next Debian release
# (trixie, CUDA 12.4.1; sid has the same, only experimental has 12.5),
# fetched with `apt-get download` through a private apt configuration
# (nothing is installed into the system, /etc/apt is not touched), unpacked
# with dpkg -x into a scratch folder and arranged as a normal
# /usr/local/cuda-style tree (bin/, nvvm/, include/, lib64/) with its
# own nvcc.profile. NVIDIA builds those binaries for old glibc; they run on
# Debian 12, with the system gcc 12 as host compiler (CUDA 12.4 takes gcc <= 13).
# The mirror is the one this machine's apt already uses (DEBIAN_MIRROR overrides).
#
# Then the package is built (pip wheel --no-build-isolation, as the release
# does) against torch 2.14.1 from a venv, for CUDA12_ARCHS, and _C_cuda.so is
# checked: cuobjdump --list-elf (one cubin per architecture), no libcudart.so
# dependency (cudart is static), and build_info's cuda_version == 12.4. At the
# end the built package is imported under torch 2.14.1+cu130, which must fail
# with the CUDA-major mismatch message (a 12.x build in a 13.x torch).
#
# Environment:
#   WORK           scratch folder, kept for reuse (default /tmp/dirmult-cuda12)
#   PYTHON         python with torch (CUDA build), pybind11, cmake, ninja,
#                  setuptools (default: a venv in WORK with torch==2.14.1)
#   CUDA12_ARCHS   CMAKE_CUDA_ARCHITECTURES (default 90; 12.4 knows up to 90)
#   DIRMULT_BUILD_JOBS  parallel jobs (default 2)
#   DEBIAN_MIRROR  Debian archive URL (default: taken from /etc/apt)
#   DEBIAN_SUITE   suite holding a CUDA 12 toolkit (default trixie)
#   CUDA12_PIP_SERIES  nvidia-cuda-nvcc-cu12 series step 1 inspects (default "12.9 12.8")
#   SKIP_PIP_CHECK=1  skip step 1 (it downloads ~40 MB a series)
# Takes ~1 GB of downloads (nvidia-cuda-dev is 0.9 GB), ~3 GB unpacked.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/dirmult-cuda12}"
ARCHS="${CUDA12_ARCHS:-90}"
SUITE="${DEBIAN_SUITE:-trixie}"
export DIRMULT_BUILD_JOBS="${DIRMULT_BUILD_JOBS:-2}"
mkdir -p "$WORK"
t0=$SECONDS
say() { printf '\n=== [%3ds] %s\n' "$((SECONDS - t0))" "$*"; }
quiet_pip() { "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }; }

# ---------------------------------------------------------------- 1. pip cu12
# What nvcc needs to turn a .cu file into a linked object, relative to the
# wheel's nvidia/cuda_nvcc/ (the layout of a CUDA toolkit root). The headers
# and libcudart_static.a come from nvidia-cuda-runtime-cu12 and
# nvidia-cuda-cccl-cu12, which do carry them, so only this wheel is inspected.
PIP_NEEDED=(bin/nvcc bin/nvcc.profile bin/cudafe++ bin/fatbinary bin/nvlink bin/ptxas
            bin/crt/link.stub nvvm/bin/cicc nvvm/lib64/libnvvm.so
            nvvm/libdevice/libdevice.10.bc include/crt/host_config.h)
if [[ "${SKIP_PIP_CHECK:-0}" != 1 ]]; then
  say "1. does the package index's nvidia-cuda-nvcc-cu12 hold a whole compiler?"
  rm -rf "$WORK/pipdl"
  pip_complete=""
  for series in ${CUDA12_PIP_SERIES:-12.9 12.8}; do
    dl="$WORK/pipdl/$series"
    quiet_pip python3 -m pip download -q --no-deps -d "$dl" "nvidia-cuda-nvcc-cu12==$series.*" || true
    whl=("$dl"/nvidia_cuda_nvcc_cu12-*.whl)
    [[ -f "${whl[0]}" ]] || { echo "nvidia-cuda-nvcc-cu12==$series.*: no wheel downloaded" >&2; continue; }
    echo "$(basename "${whl[0]}"):"
    if python3 - "${whl[0]}" "${PIP_NEEDED[@]}" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = sys.argv[2:]
have = [f for f in need if "nvidia/cuda_nvcc/" + f in names]
missing = [f for f in need if f not in have]
print("    has:    ", " ".join(have) or "none of them")
print("    missing:", " ".join(missing) or "nothing")
sys.exit(1 if missing else 0)
EOF
    then pip_complete+=" $(basename "${whl[0]}")"; fi
  done
  if [[ -n "$pip_complete" ]]; then
    echo "-> UNEXPECTED: a whole CUDA 12 compiler is on the index now:$pip_complete"
    echo "   (this script should be switched to it; it still uses Debian's 12.4 below)"
  else
    echo "-> no nvcc driver/cicc/cudafe++/fatbinary/nvlink in nvidia-cuda-nvcc-cu12: the index"
    echo "   cannot provide a CUDA 12 compiler; using Debian's CUDA 12 toolkit"
  fi
fi

# ------------------------------------------------- 2. CUDA 12 toolkit (Debian)
CUDA="$WORK/cuda-12"
# the compiler, cudart (static) and headers; libcu++ (nv/target, cuda/std),
# CUB and Thrust are separate Debian packages that cuda_fp16.h & co. include
DEBS=(nvidia-cuda-toolkit nvidia-cuda-dev libnvvm4 libcudart12 libcu++-dev libcub-dev libthrust-dev)
if [[ "$(cat "$CUDA/.complete" 2>/dev/null)" != "${DEBS[*]}" ]]; then
  say "2. fetching Debian $SUITE's CUDA 12 toolkit (apt-get download, private apt state)"
  MIRROR="${DEBIAN_MIRROR:-}"
  if [[ -z "$MIRROR" ]]; then
    MIRROR="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
      /^URIs:/ {u=$2} /^Suites:/ {s=$0}
      /^$/ { if (u != "" && s ~ /bookworm( |$)/ && u !~ /security/) { print u; exit } u=""; s="" }
      END { if (u != "" && s ~ /bookworm( |$)/ && u !~ /security/) print u }' | head -1)"
  fi
  if [[ -z "$MIRROR" ]]; then
    MIRROR="$(grep -hE '^deb[[:space:]]' /etc/apt/sources.list 2>/dev/null | grep -v security \
              | awk '{print $2}' | head -1)"
  fi
  [[ -n "$MIRROR" ]] || { echo "no Debian mirror found in /etc/apt; set DEBIAN_MIRROR" >&2; exit 1; }
  APT="$WORK/apt"
  mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$WORK/debs"
  echo "deb $MIRROR $SUITE main contrib non-free" > "$APT/sources.list"
  aptopts=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o "Dir::Etc::sourceparts=-"
           -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache"
           -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1")
  apt-get "${aptopts[@]}" update -qq
  (cd "$WORK/debs"
   apt-get "${aptopts[@]}" download "${DEBS[@]}" 2>&1 \
     | { grep -v '^W: Download is performed unsandboxed' || true; })
  ls -l "$WORK/debs"
  rm -rf "$WORK/root" "$CUDA"
  for d in "$WORK"/debs/*.deb; do dpkg -x "$d" "$WORK/root"; done
  R="$WORK/root"
  mkdir -p "$CUDA/bin" "$CUDA/nvvm/bin" "$CUDA/nvvm/lib64"
  cp -a "$R/usr/lib/nvidia-cuda-toolkit/bin/nvcc" "$R/usr/lib/nvidia-cuda-toolkit/bin/crt" "$CUDA/bin/"
  for b in ptxas fatbinary nvlink cudafe++ bin2c cuobjdump nvdisasm nvprune cu++filt; do
    if [[ -e "$R/usr/bin/$b" ]]; then cp -a "$R/usr/bin/$b" "$CUDA/bin/"; fi
  done
  cp -a "$R/usr/lib/nvidia-cuda-toolkit/bin/cicc" "$CUDA/nvvm/bin/"
  cp -a "$R/usr/lib/nvidia-cuda-toolkit/libdevice" "$CUDA/nvvm/"
  cp -a "$R"/usr/lib/x86_64-linux-gnu/libnvvm.so* "$CUDA/nvvm/lib64/"
  ln -s "$R/usr/include" "$CUDA/include"
  ln -s "$R/usr/lib/x86_64-linux-gnu" "$CUDA/lib64"
  cat > "$CUDA/bin/nvcc.profile" <<'EOF'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
  echo "${DEBS[*]}" > "$CUDA/.complete"
fi
say "2. toolkit at $CUDA"
"$CUDA/bin/nvcc" --version | tail -2
echo "host compiler: $(g++ --version | head -1)"

# ------------------------------------------------------------ 3. python + torch
if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
else
  PY="$WORK/venv/bin/python"
  if [[ ! -x "$PY" ]] || ! "$PY" -c 'import torch, numpy, pybind11, cmake, ninja, setuptools' 2>/dev/null; then
    say "3. venv with torch==2.14.1"
    python3 -m venv "$WORK/venv"
    quiet_pip "$PY" -m pip install -q "torch==2.14.1" numpy pybind11 cmake ninja setuptools wheel
  fi
fi
say "3. python $PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# ------------------------------------------------------------------ 4. build
say "4. building with $CUDA/bin/nvcc for CUDA architectures $ARCHS"
SRC="$WORK/src"
rm -rf "$SRC" "$WORK/dist" "$WORK/unpacked"
mkdir -p "$SRC" "$WORK/dist"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
   | while IFS= read -r -d '' f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done \
   | tar --null -T - -cf -) | tar -xf - -C "$SRC"
ls "$SRC"/src/cuda/*.cu >/dev/null 2>&1 || { echo "no src/cuda/*.cu in the checkout yet" >&2; exit 1; }
CUDACXX="$CUDA/bin/nvcc" CUDAToolkit_ROOT="$CUDA" DIRMULT_CUDA_ARCHS="$ARCHS" \
  "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$WORK/dist" "$SRC" 2>&1 \
  | grep -vE 'is ignored: it is neither a file nor a directory' \
  | grep -E 'dirmult:|CUDA|nvcc|error|warning|Building|Linking|Created wheel|^\s*\[[0-9]+/[0-9]+\]' || true
WHL=("$WORK"/dist/*.whl)
[[ -f "${WHL[0]}" ]] || { echo "build failed (no wheel); rerun with the log: see pip output above" >&2; exit 1; }
echo "wheel: $(basename "${WHL[0]}")"

# ------------------------------------------------------------------ 5. checks
say "5. checking _C_cuda.so"
mkdir -p "$WORK/unpacked"
"$PY" -m zipfile -e "${WHL[0]}" "$WORK/unpacked"
LIB="$WORK/unpacked/dirmult_ext/ops/_C_cuda.so"
[[ -f "$LIB" ]] || { echo "no _C_cuda.so in the wheel: the CUDA kernels were not built" >&2; exit 1; }
echo "--- cuobjdump --list-elf"
"$CUDA/bin/cuobjdump" --list-elf "$LIB"
echo "--- cuobjdump --list-ptx"
"$CUDA/bin/cuobjdump" --list-ptx "$LIB" || true
echo "--- NEEDED"
readelf -d "$LIB" | grep -E 'NEEDED|RUNPATH' | sed 's/^ *//'
if readelf -d "$LIB" | grep -q 'libcudart\.so'; then
  echo "FAIL: _C_cuda.so depends on libcudart.so (expected static cudart)" >&2; exit 1
fi
ELFS="$("$CUDA/bin/cuobjdump" --list-elf "$LIB")"
for a in ${ARCHS//;/ }; do
  a="${a%%-*}"
  [[ "$ELFS" == *"sm_${a}."* ]] || { echo "FAIL: no sm_${a} cubin in _C_cuda.so" >&2; exit 1; }
done
echo "--- build_info (from _C, without the package's CUDA loader)"
(cd "$WORK" && PYTHONPATH="$WORK/unpacked" "$PY" - <<'EOF'
import glob, importlib.util, os
import torch  # first: _C links libtorch_cpu/libc10
so = glob.glob(os.path.join(os.environ["PYTHONPATH"], "dirmult_ext", "_C.*.so"))[0]
spec = importlib.util.spec_from_file_location("dirmult_ext._C", so)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
info = dict(mod.build_info())
print(info)
assert info["cuda_version"].startswith("12."), info
EOF
)
echo "--- importing the 12.x build under torch $("$PY" -c 'import torch; print(torch.__version__)') (expect the mismatch ImportError)"
set +e
(cd "$WORK" && PYTHONPATH="$WORK/unpacked" "$PY" -c 'import dirmult_ext' 2>&1 | tail -1)
set -e
NVCC_REL="$("$CUDA/bin/nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
say "OK: dirmult_ext compiles and links with nvcc $NVCC_REL (Debian $SUITE nvidia-cuda-toolkit) for CUDA architectures $ARCHS"
