#!/usr/bin/env bash
# The GPU check, run on the H200 machine in one call from the repo root:
#   builds an sdist of the checkout, builds a wheel from that sdist against
#   the machine's torch and installs it into a folder of its own (pip
#   --target, put on PYTHONPATH; torch and the test tools are the machine's),
#   then, against that installed wheel: the main job on CUDA (and dm_log_normal's bits
#   against logf, scripts/gpu/check_log_normal.cu), every op's argument errors
#   (scripts/gpu/probe_op_errors.py), the whole test suite with CUDA,
#   compute-sanitizer (memcheck and racecheck) on every kernel, the 2-GPU fit
#   when two GPUs are present, the benchmark, and Nsight Compute on the hot
#   kernels, and the large sparse fit measured (time per EM iteration, peak
#   host RSS against the CSR bytes, peak GPU memory; on the device and
#   streamed from host memory). Logs go to $OUT (default ./gpu_out).
# Stages can be picked: scripts/gpu/gpu_check.sh [wheel] [sass] [check] [probe] [test] [sanitize] [multigpu] [bench] [profile] [profile_csr] [bigfit] [atlas]
# (atlas, minutes and 16 GB of pinned host memory, only when named).
# (every stage but wheel needs a wheel installed by an earlier wheel stage).
# Environment:
#   DIRMULT_SASS_BASELINE=F  sass stage: F, a _C_cuda.so of an earlier build, against
#                            the installed one (DIRMULT_SASS_NEW=F2 to name another),
#                            function by function (scripts/gpu/compare_sass.py)
#   DIRMULT_GPU_WHEELS=DIR   extra wheels (e.g. pyro-ppl) installed beside the package
#   DIRMULT_BENCH_TIMINGS    bench stage's timings (default: "queued synced graph")
#   DIRMULT_GPU_TESTS        test stage's test paths, relative to the repo (default: tests)
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
REPO=$PWD
WORK=${DIRMULT_GPU_WORK:-/tmp/dirmult_gpu}
SITE=$WORK/site
PY=python3
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stages=${*:-wheel sass check probe test sanitize multigpu bench profile profile_csr bigfit}
status=0
summary=()
run_stage() {  # log (file name under $OUT, appended to), label, command...
  local log=$1 label=$2; shift 2
  local t0=$SECONDS
  echo "=== $label: $*" | tee -a "$OUT/$log.log"
  if "$@" >> "$OUT/$log.log" 2>&1; then
    summary+=("$label: ok ($((SECONDS - t0)) s)")
  else
    summary+=("$label: FAILED ($((SECONDS - t0)) s), see $log.log"); status=1
  fi
  tail -n 25 "$OUT/$log.log"
}
has() { [[ " $stages " == *" $1 "* ]]; }

# Logs: summary.txt, build, check, test, sanitize, multigpu, bench
# (.log, .json, _sparse.json), profile and bigfit (.log, .json); the device returns 8 files a call,
# so run profile in a call of its own.
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count())"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

install_wheel() {  # the wheel in $WORK/dist, into $SITE
  rm -rf "$SITE"
  python3 -m pip install -q --no-deps --no-index --target "$SITE" "$WORK"/dist/dirmult_ext-*.whl \
    || return 1
  if [ -n "${DIRMULT_GPU_WHEELS:-}" ]; then
    python3 -m pip install -q --no-deps --no-index --target "$SITE" "$DIRMULT_GPU_WHEELS"/*.whl
  fi
}
build_wheel_from_sdist() {
  rm -rf "$WORK" && mkdir -p "$WORK/dist" || return 1
  # From $WORK: a build/ folder in the checkout would shadow the build package.
  (cd "$WORK" && python3 -m build --sdist --no-isolation --outdir "$WORK/dist" "$REPO") || return 1
  env DIRMULT_CUDA_ARCHS="${DIRMULT_CUDA_ARCHS:-90}" DIRMULT_BUILD_JOBS=16 \
    python3 -m pip wheel --no-build-isolation --no-deps --no-index -w "$WORK/dist" \
    "$WORK"/dist/dirmult_ext-*.tar.gz || return 1
  install_wheel || return 1
  ls -l "$WORK/dist"
  (cd "$WORK" && PYTHONPATH=$SITE "$PY" -m dirmult_ext)  # build info of the installed wheel
  command -v cuobjdump >/dev/null && cuobjdump -res-usage "$SITE/dirmult_ext/ops/_C_cuda.so" \
    | grep -A1 "table" | grep -B1 "REG" | head -60
  return 0
}
if has wheel; then
  run_stage build "wheel from sdist" build_wheel_from_sdist
  [ $status -eq 0 ] || { printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"; exit 1; }
fi
# Everything below runs the installed wheel, from outside the checkout.
[ -d "$SITE/dirmult_ext" ] || install_wheel || exit 1
export PYTHONPATH=$SITE DIRMULT_EXPECT_INSTALLED_IN=$SITE
cd "$WORK" || exit 1
if has sass && [ -n "${DIRMULT_SASS_BASELINE:-}" ]; then
  run_stage check "sass against $DIRMULT_SASS_BASELINE" "$PY" "$REPO/scripts/gpu/compare_sass.py" \
    "$DIRMULT_SASS_BASELINE" "${DIRMULT_SASS_NEW:-$SITE/dirmult_ext/ops/_C_cuda.so}"
fi
has check && run_stage check check "$PY" -m dirmult_ext check --rows 65536 --categories 1024
# dm_log_normal (math.h) is the toolkit's logf without its special cases:
# the same bits for every normal float, or the table and math paths could
# part.
has check && run_stage check "dm_log_normal bits" bash -c "nvcc -std=c++17 -arch=sm_90 \
  -I '$REPO/include' '$REPO/scripts/gpu/check_log_normal.cu' -o '$WORK/check_log_normal' \
  && '$WORK/check_log_normal'"
# Every argument error of every op, CPU and CUDA, eager and TorchScript, a
# process per call: each must raise (Note [Stable ABI errors]); the log also
# shows whether this torch's C++ errors alone would.
has probe && run_stage check "op error probe" "$PY" "$REPO/scripts/gpu/probe_op_errors.py"
# pytest-xdist, where the machine has it, runs the suite on 12 workers.
parallel=$("$PY" -c 'import xdist' 2>/dev/null && echo "-n 12")
# shellcheck disable=SC2086
read -r -a test_paths <<< "${DIRMULT_GPU_TESTS:-tests}"
# (-o addopts=: the slow tests too, which the README's command leaves out)
has test && run_stage test test "$PY" -m pytest "${test_paths[@]/#/$REPO/}" -q -p no:cacheprovider -rfE \
  --rootdir "$REPO" -o addopts= $parallel
if has sanitize; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1  # so memcheck sees each allocation's bounds
  run_stage sanitize memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$PY" "$REPO/scripts/gpu/sanitizer_cases.py"
  run_stage sanitize racecheck compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$PY" "$REPO/scripts/gpu/sanitizer_cases.py"
  run_stage sanitize "memcheck, CSR" compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$PY" "$REPO/scripts/gpu/sparse_cases.py"
  run_stage sanitize "racecheck, CSR" compute-sanitizer --tool racecheck --error-exitcode 1 \
    "$PY" "$REPO/scripts/gpu/sparse_cases.py"
  run_stage sanitize "memcheck, extreme log_alpha" compute-sanitizer --tool memcheck \
    --error-exitcode 1 "$PY" "$REPO/scripts/gpu/extreme_cases.py"
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
fi
if has multigpu; then
  n_gpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$n_gpu" -ge 2 ]; then
    run_stage multigpu "2-GPU sparse fit" bash "$REPO/scripts/gpu/multigpu_fit_check.sh"
  else
    summary+=("2-GPU sparse fit: not run ($n_gpu GPU)")
  fi
fi
if has bench; then
  timings=" ${DIRMULT_BENCH_TIMINGS:-queued synced graph} "
  [[ $timings == *" queued "* ]] && run_stage bench bench "$PY" -m dirmult_ext.cli.bench \
    --per-sample --components 16 --markdown --json "$OUT/bench.json"
  # The same shapes with a synchronize after every call (the latency of an
  # isolated call).
  [[ $timings == *" synced "* ]] && run_stage bench "bench synced" "$PY" -m dirmult_ext.cli.bench \
    --timing synced --no-compile --markdown --quiet
  # And replayed from CUDA graphs: the GPU time per call, no host in the way.
  [[ $timings == *" graph "* ]] && run_stage bench "bench graph" "$PY" -m dirmult_ext.cli.bench \
    --timing graph --no-compile --markdown --quiet
  # What the eager fast path (ops/dispatch.py) saves: the same synced calls
  # through the registered op (DIRMULT_FAST_PATH=0).
  [[ $timings == *" synced "* ]] && run_stage bench "bench synced, public path" env \
    DIRMULT_FAST_PATH=0 "$PY" -m dirmult_ext.cli.bench --shapes seed mid --timing synced \
    --no-compile --no-numpyro --markdown --quiet
  # CSR counts: the package, the PyTorch written over the nonzeros, the dense op.
  run_stage bench "bench CSR" "$PY" -m dirmult_ext.cli.bench --sparse --markdown \
    --json "$OUT/bench_sparse.json"
fi
if has profile && command -v ncu >/dev/null; then
  run_stage profile "ncu" timeout 300 ncu --clock-control none \
    -k "regex:forward_table|with_grad|components_table|column_backward|column_finish|components_finish|alpha_prep|prep_and_table|finish_rows|row_weights|row_count_totals|per_sample" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    "$PY" "$REPO/scripts/gpu/profile_kernels.py"
fi
# The CSR kernels at the large sparse shapes: what bounds them.
if has profile_csr && command -v ncu >/dev/null; then
  run_stage profile_csr "ncu, CSR" timeout 300 ncu --clock-control none -k "regex:csr_" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    "$PY" "$REPO/scripts/gpu/profile_csr_kernels.py"
fi
# A 1,000,000 x 50,000 k = 10 mixture matrix (about 1.1e8 nonzeros) fitted by
# the CLI, on the device and streamed (--batch-size 200000); bigfit.json.
has bigfit && run_stage bigfit "large sparse fit" "$PY" "$REPO/scripts/gpu/big_sparse_fit.py" \
  --json "$OUT/bigfit.json"
# The atlas run: 10,000,000 x 30,000 (2e9 nonzeros) from pinned host memory; atlas.json.
has atlas && run_stage atlas "atlas run" "$PY" "$REPO/scripts/gpu/atlas_fit.py" \
  --json "$OUT/atlas.json"
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/summary.txt"
exit $status
