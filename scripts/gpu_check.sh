#!/usr/bin/env bash
# The GPU check, run on the H200 machine in one call from the repo root:
#   builds the package against the machine's torch, runs the main job on
#   CUDA, the whole test suite with CUDA, compute-sanitizer (memcheck and
#   racecheck) on every kernel, the 2-GPU fit when two GPUs are present, and
#   the benchmark. Logs go to $OUT (default ./gpu_out).
# Stages can be picked: scripts/gpu_check.sh [build] [check] [test] [sanitize] [multigpu] [bench]
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
REPO=$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stages=${*:-build check test sanitize multigpu bench}
status=0
summary=()
run_stage() {  # name (also the log file, appended to), command...
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*" | tee -a "$OUT/$name.log"
  if "$@" >> "$OUT/$name.log" 2>&1; then
    summary+=("$name: ok ($((SECONDS - t0)) s)")
  else
    summary+=("$name: FAILED ($((SECONDS - t0)) s), see $name.log"); status=1
  fi
  tail -n 25 "$OUT/$name.log"
}
has() { [[ " $stages " == *" $1 "* ]]; }

# At most 8 files come back from the device: keep to build, check, test,
# sanitize, multigpu, bench (.log and .json) and summary.txt.
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count())"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

if has build; then
  run_stage build env DIRMULT_CUDA_ARCHS=${DIRMULT_CUDA_ARCHS:-90} DIRMULT_BUILD_JOBS=16 \
    python3 setup.py build_ext --inplace
fi
export PYTHONPATH=$REPO/python
if has check; then
  run_stage check python3 -m dirmult_ext check --rows 65536 --categories 1024
  run_stage check python3 scripts/probe_op_errors.py
fi
has test && run_stage test python3 -m pytest "$REPO/tests" -q -p no:cacheprovider -rfE
if has sanitize; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # so memcheck sees each allocation's bounds
  run_stage sanitize compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 scripts/sanitizer_cases.py
  run_stage sanitize compute-sanitizer --tool racecheck --error-exitcode 1 \
    python3 scripts/sanitizer_cases.py
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
fi
if has multigpu && [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ] \
   && [ -f "$REPO/scripts/multigpu_fit_check.sh" ]; then
  run_stage multigpu bash "$REPO/scripts/multigpu_fit_check.sh"
fi
if has bench; then
  run_stage bench python3 -m dirmult_ext.bench --per-sample --components 16 --markdown \
    --json "$OUT/bench.json"
fi
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
exit $status
