"""``dirmult-ext check``: print the build, run the op on a built-in problem
on the best device, check it against float64, time it against eager."""
from __future__ import annotations

import argparse
import time

import torch

from .. import build_info
from ..likelihood.log_lik import log_lik, reference_log_lik


def _time(fn, device, reps=20):
    for _ in range(3):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    else:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return sorted(times)[len(times) // 2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dirmult-ext check", description=__doc__)
    p.add_argument("--device", default=None, help="cpu or cuda[:i] (default: best available)")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--categories", type=int, default=512)
    args = p.parse_args(argv)

    info = build_info()
    print("dirmult_ext", info["version"])
    print(f"  torch {info['torch']} (CUDA {info['torch_cuda']}), built for torch >= {info['torch_target']}")
    print(f"  CUDA kernels: {'CUDA ' + info['cuda_version'] if info['cuda_version'] else 'not built'}"
          f" [{info['cuda_architectures']}], loaded: {info['cuda_kernels_loaded']}")
    print(f"  CPU kernels: {'AVX2' if info['cpu_simd'] == 'avx2' else 'scalar'}"
          " (DIRMULT_CPU_SIMD=none turns AVX2 off)")
    if info["cuda_kernels_loaded"]:
        print(f"  CUDA components way: {info['cuda_components_way']}"
              " (DIRMULT_CUDA_COMPONENTS=fused|per_component forces one)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available()
                                          and info["cuda_kernels_loaded"] else "cpu"))
    g = torch.Generator().manual_seed(int(time.time()))
    B, V = args.rows, args.categories
    # Sparse-ish counts with a wide range of concentrations, where float32
    # lgamma differences go wrong.
    counts = torch.poisson(torch.rand(B, V, generator=g) * 3.0, generator=g)
    log_alpha = torch.empty(V).uniform_(-6.0, 14.0, generator=g)
    counts, log_alpha = counts.to(device), log_alpha.to(device)

    out = log_lik(counts, log_alpha)
    ref = reference_log_lik(counts.double().cpu(), log_alpha.double().cpu())
    eager32 = reference_log_lik(counts, log_alpha)
    scale = ref.abs().max().item()
    err = (out.double().cpu() - ref).abs().max().item() / scale
    err_eager = (eager32.double().cpu() - ref).abs().max().item() / scale
    print(f"problem: {B} x {V} counts (zeros {100 * (counts == 0).float().mean().item():.0f}%), "
          f"alpha in [{log_alpha.exp().min().item():.2g}, {log_alpha.exp().max().item():.2g}], on {device}")
    print(f"  max error vs float64, relative to max |log_lik|: dirmult {err:.2e}, "
          f"eager float32 formula {err_eager:.2e}")
    t_ext = _time(lambda: log_lik(counts, log_alpha), device)
    t_eager = _time(lambda: reference_log_lik(counts, log_alpha), device)
    print(f"  forward time: dirmult {t_ext:.1f} us, eager float32 {t_eager:.1f} us "
          f"({t_eager / t_ext:.1f}x)")
    ok = err < 1e-5
    print("OK" if ok else "FAILED: error above 1e-5")
    return 0 if ok else 1
