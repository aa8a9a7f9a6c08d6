#!/usr/bin/env bash
# Install a built dirmult_ext wheel into a fresh venv with an OLDER, CPU-only
# torch and run the CPU test suite against the installed package.
#
#   scripts/ci/cross_version_test.sh wheelhouse/dirmult_ext-*.whl
#
# This is the stable-ABI promise checked end to end: a wheel built against
# torch 2.14.1 (CUDA 13.0) must import and pass its CPU tests under torch
# 2.13.0+cpu, where ops/library.py skips _C_cuda.so because torch.version.cuda is None;
# then the error, autograd and fuzz tests again with the ops' Python argument
# checks forced on (DIRMULT_OP_CHECKS=python).
# The tests run from a scratch directory, so `import dirmult_ext` finds the
# installed wheel, never python/ of the checkout (checked before and during
# the run through DIRMULT_EXPECT_INSTALLED_IN, see tests/test_packaging.py).
#
# Environment:
#   TORCH_SPEC     torch requirement for the venv (default: torch==2.13.0)
#   TORCH_INDEX_URL  pip index to take torch from (default: pip's configured
#                  one; on a machine whose default torch has CUDA, point it at
#                  a CPU-only torch index to test the CPU-only path)
#   BASE_PYTHON    interpreter to make the venv from (default: python3)
#   VENV           venv folder (default: a temporary one, removed at exit)
#   PYTEST_ARGS    extra pytest arguments (default: none)
#   WHEEL_EXTRAS   the wheel's extras whose requirements the tests need
#                  (default: test,fit)
#   EXTRA_PIP      extra packages for the test venv (default: none)
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 WHEEL [more pytest args]" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WHEEL="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
shift
[[ -f "$WHEEL" ]] || { echo "no such wheel: $WHEEL" >&2; exit 2; }
for a in "$@"; do
  [[ "$a" != *.whl ]] || { echo "one wheel at a time (got $WHEEL and $a)" >&2; exit 2; }
done
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
BASE_PYTHON="${BASE_PYTHON:-python3}"

SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/dirmult-xver.XXXXXX")"
if [[ -z "${VENV:-}" ]]; then
  VENV="$SCRATCH/venv"
fi
trap 'rm -rf "$SCRATCH"' EXIT
# pip, without the "Location ... is ignored" lines some pip configurations print per package
pip_q() { "$PY" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }; }
say() { printf '\n=== [%3ds] %s\n' "$((SECONDS - t0))" "$*"; }
t0=$SECONDS

say "venv $VENV from $("$BASE_PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
"$BASE_PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"

say "pip install $TORCH_SPEC${TORCH_INDEX_URL:+ (from \$TORCH_INDEX_URL)}"
pip_q install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
# The wheel itself without dependencies (torch must stay the one above), then
# what its test/fit extras and the suite need, with torch pinned.
say "pip install --no-deps $(basename "$WHEEL")"
pip_q install -q --no-deps "$WHEEL"
TORCH_PIN="$("$PY" -c 'from importlib.metadata import version; print(version("torch").split("+")[0])')"
echo "torch==$TORCH_PIN" > "$SCRATCH/constraints.txt"
say "pip install dirmult_ext[${WHEEL_EXTRAS:-test,fit}] requirements + pytest numpy scipy mpmath ${EXTRA_PIP:-} (torch==$TORCH_PIN kept)"
# shellcheck disable=SC2086
pip_q install -q -c "$SCRATCH/constraints.txt" "${WHEEL}[${WHEEL_EXTRAS:-test,fit}]" \
  pytest numpy scipy mpmath ${EXTRA_PIP:-}

cd "$SCRATCH"   # outside the source tree: nothing of the checkout is importable
say "import check (cwd $SCRATCH)"
"$PY" - "$VENV" <<'EOF'
import os, sys
import torch
import dirmult_ext
venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(dirmult_ext.__file__)
info = dirmult_ext.build_info()
print(f"torch {torch.__version__} (cuda {torch.version.cuda})")
print(f"dirmult_ext {dirmult_ext.__version__} from {where}")
for k in sorted(info):
    print(f"  {k}: {info[k]}")
assert where.startswith(venv + os.sep), f"dirmult_ext imported from {where}, not from the venv"
if torch.version.cuda is None:
    assert not info["cuda_kernels_loaded"], "CUDA kernels loaded under a CPU-only torch"
counts = torch.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]])
la = torch.zeros(3, requires_grad=True)
out = dirmult_ext.log_lik(counts, la)
ref = dirmult_ext.reference_log_lik(counts, la)
torch.testing.assert_close(out, ref)
out.sum().backward()
print("log_lik on CPU matches the reference:", out.tolist())
EOF

say "pytest -m 'not cuda' $ROOT/tests ${PYTEST_ARGS:-} $*"
set +e
# shellcheck disable=SC2086
DIRMULT_EXPECT_INSTALLED_IN="$VENV" "$PY" -m pytest -q -p no:cacheprovider \
  -m "not cuda" "$ROOT/tests" ${PYTEST_ARGS:-} "$@"
rc=$?
# The ops' Python argument checks (Note [Stable ABI errors]), on by default
# only where torch < 2.13, forced on: the tests of errors, autograd and the
# fuzz cases once more through them (tests/test_errors.py forces them in
# processes of its own in the run above too).
say "pytest with DIRMULT_OP_CHECKS=python: test_errors test_fuzz test_log_lik test_log_lik_with_grad"
DIRMULT_OP_CHECKS=python DIRMULT_EXPECT_INSTALLED_IN="$VENV" "$PY" -m pytest -q -p no:cacheprovider \
  -m "not cuda" "$ROOT/tests/test_errors.py" "$ROOT/tests/test_fuzz.py" \
  "$ROOT/tests/test_log_lik.py" "$ROOT/tests/test_log_lik_with_grad.py" "$@"
rc_checks=$?
set -e
say "cross-version test finished: pytest exit codes $rc (suite), $rc_checks (Python op checks)"
[[ $rc -eq 0 ]] && exit $rc_checks
exit $rc
