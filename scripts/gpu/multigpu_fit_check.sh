#!/usr/bin/env bash
# The 2-GPU fit: the same synthetic count matrix fitted by one GPU
# and by two (torchrun, NCCL, each rank holding half of the rows) must give
# the same concentrations. Run by scripts/gpu/gpu_check.sh on a 2-GPU machine.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tmp=$(mktemp -d)
args=(--synthetic --rows 200000 --cols 300 --seed 7 --tol 1e-10)
python3 -m dirmult_ext.distributed "${args[@]}" --out "$tmp/one.npz"
python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m dirmult_ext.distributed "${args[@]}" --out "$tmp/two.npz"
python3 - "$tmp/one.npz" "$tmp/two.npz" <<'PY'
import sys
import numpy as np
one, two = np.load(sys.argv[1]), np.load(sys.argv[2])
rel_ll = abs(float(one["log_lik"]) - float(two["log_lik"])) / abs(float(one["log_lik"]))
max_la = float(np.max(np.abs(one["log_alpha"] - two["log_alpha"])))
print(f"1 GPU vs 2 GPUs: log-lik relative difference {rel_ll:.2e}, max |log_alpha diff| {max_la:.2e}")
assert rel_ll < 1e-9 and max_la < 1e-6, "the 2-GPU fit does not match the 1-GPU fit"
print("2-GPU fit matches the 1-GPU fit")
PY
