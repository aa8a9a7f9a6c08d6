#!/usr/bin/env bash
# The 2-GPU sparse fit against the 1-GPU fit of the same file: a
# 1,000,000 x 50,000 CSR matrix at 0.2% nonzeros (1e8 nonzeros, values
# 1 + Poisson(3)) fitted by one DM, and a matrix of the same size drawn from
# a 10-component DM mixture fitted by a 10-component mixture, each by
# `python -m dirmult_ext.cli.distributed FILE` as one process (world size 1) and
# under torchrun over two ranks (NCCL, each rank holding half of the rows).
# Prints the log-likelihood relative difference, the largest parameter
# difference, the time per iteration on 1 and 2 GPUs (a mixture's: its EM
# iterations alone, 20 from one random start) and the speedup; exits 1
# when the fits disagree beyond the tolerances below (float64 statistics
# summed in another order move the result by far less). With fewer than two
# GPUs it says so and exits 0 without running. Run by scripts/gpu/gpu_check.sh.
#
# Environment (defaults in brackets):
#   MULTIGPU_ROWS [1000000], MULTIGPU_COLS [50000]  matrix size
#   MULTIGPU_DEVICE [cuda]   cpu: run on the CPU (gloo), whatever the GPUs, to try the script
#                            (one thread per process, so the speedup is of 2 cores over 1)
#   MULTIGPU_PARTS ["dm mixture"]  which fits to compare
#   MULTIGPU_LL_RTOL [1e-11], MULTIGPU_PARAM_ATOL [1e-7]  tolerances: log-likelihood
#                            relative difference, largest |log alpha| (and mixture weight) difference
#   MULTIGPU_TMP             folder for the matrices and results [a fresh mktemp -d, removed after]
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
here=$(cd "$(dirname "$0")" && pwd)
device=${MULTIGPU_DEVICE:-cuda}
rows=${MULTIGPU_ROWS:-1000000}
cols=${MULTIGPU_COLS:-50000}
parts=" ${MULTIGPU_PARTS:-dm mixture} "
export MULTIGPU_LL_RTOL=${MULTIGPU_LL_RTOL:-1e-11} MULTIGPU_PARAM_ATOL=${MULTIGPU_PARAM_ATOL:-1e-7}

if [ "$device" = cuda ]; then
  n_gpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  if [ "$n_gpu" -lt 2 ]; then
    echo "fewer than two GPUs ($n_gpu): the 2-GPU fit check does not run"
    exit 0
  fi
  dev_args=()
else
  dev_args=(--device "$device")
  # one thread per process, as torchrun gives each rank: the 1-process run
  # times one core's work
  export OMP_NUM_THREADS=1
fi
if [ -n "${MULTIGPU_TMP:-}" ]; then
  tmp=$MULTIGPU_TMP; mkdir -p "$tmp"
else
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fi

# The two matrices, written side by side.
pids=()
[[ $parts == *" dm "* ]] && { "$PY" "$here/write_sparse_matrix.py" poisson "$tmp/dm.npz" \
  --rows "$rows" --cols "$cols" --seed 1 & pids+=($!); }
[[ $parts == *" mixture "* ]] && { "$PY" "$here/write_sparse_matrix.py" mixture "$tmp/mixture.npz" \
  --rows "$rows" --cols "$cols" --k 10 --seed 2 & pids+=($!); }
for p in "${pids[@]}"; do wait "$p"; done

status=0
fit_both() {  # name, file, fit arguments...
  local name=$1 file=$2; shift 2
  echo "--- $name: 1 process"
  "$PY" -m dirmult_ext.cli.distributed "$file" "${dev_args[@]}" "$@" --out "$tmp/$name.one.npz"
  echo "--- $name: 2 processes (torchrun)"
  "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 -m dirmult_ext.cli.distributed \
    "$file" "${dev_args[@]}" "$@" --out "$tmp/$name.two.npz"
  "$PY" - "$name" "$tmp/$name.one.npz" "$tmp/$name.two.npz" <<'PY' || status=1
import os
import sys
import numpy as np
name, one, two = sys.argv[1], np.load(sys.argv[2]), np.load(sys.argv[3])
ll_rtol, p_atol = float(os.environ["MULTIGPU_LL_RTOL"]), float(os.environ["MULTIGPU_PARAM_ATOL"])
rel_ll = abs(float(one["log_lik"]) - float(two["log_lik"])) / abs(float(one["log_lik"]))
# Components of precision above 1e6 (a few rows, near the multinomial limit)
# have a likelihood flat in the concentrations: rounding moves them freely.
la1, la2 = np.atleast_2d(one["log_alpha"]), np.atleast_2d(two["log_alpha"])
flat = np.exp(la1).sum(1) > 1e6
d_la = float(np.max(np.abs(la1 - la2)[~flat], initial=0.0))
d_w = float(np.max(np.abs(one["weights"] - two["weights"]))) if "weights" in one.files else 0.0
it1, it2 = int(one["n_iter"]), int(two["n_iter"])
# a mixture times its EM iterations alone (its start's fit left out)
t1, t2 = ((float(one["iter_s"]), float(two["iter_s"])) if "iter_s" in one.files
          else (float(one["fit_s"]) / it1, float(two["fit_s"]) / it2))
print(f"{name}: log-likelihood {float(one['log_lik']):.10e} (1) vs {float(two['log_lik']):.10e} (2), "
      f"relative difference {rel_ll:.2e} (tolerance {ll_rtol:.0e})")
print(f"{name}: max |log_alpha difference| {d_la:.2e}"
      + (f", max |weight difference| {d_w:.2e}" if "weights" in one.files else "")
      + f" (tolerance {p_atol:.0e}"
      + (f"; {int(flat.sum())} component(s) of precision > 1e6 left out" if flat.any() else "")
      + f"); iterations {it1} (1) and {it2} (2)")
print(f"{name}: time per iteration {t1 * 1e3:.1f} ms (1) and {t2 * 1e3:.1f} ms (2), "
      f"speedup {t1 / t2:.2f}x (fit {float(one['fit_s']):.2f} s and {float(two['fit_s']):.2f} s)")
ok = rel_ll <= ll_rtol and d_la <= p_atol and d_w <= p_atol and it1 == it2
print(f"{name}: {'2-process fit matches the 1-process fit' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
PY
}

if [[ $parts == *" dm "* ]]; then
  fit_both dm "$tmp/dm.npz" --tol 1e-10
fi
if [[ $parts == *" mixture "* ]]; then
  # A fixed number of EM iterations from one seeded start (random
  # responsibilities drawn per row, the same for any number of ranks), no
  # screening, so that both runs take the same steps and time the same work.
  fit_both mixture "$tmp/mixture.npz" --k 10 --n-init 1 --n-screen 0 --init random --seed 0 \
    --max-iter 20 --tol 1e-300
fi
exit $status
