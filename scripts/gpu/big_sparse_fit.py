"""The large sparse fit, measured: writes a ``mixture`` matrix (default
1,000,000 x 50,000, about 1.1e8 nonzeros, k = 10; write_sparse_matrix.py)
and runs ``dirmult-ext fit FILE --k 10`` on it twice, each in a process of
its own: the matrix on the device, then streamed from host memory
(``--batch-size``). Per run one summary line: wall time, the fit's time and
its time per EM iteration, the peak host RSS of the fit's process against
the matrix's CSR bytes (the requirement: at most about 2x), and the peak
GPU memory (``torch.cuda.max_memory_allocated`` inside the process). The
JSON goes to ``--json``, else ``$OUT/bigfit.json`` when ``OUT`` is set.

The fit's process runs the CLI's own ``main`` (``dirmult_ext.cli.fit``)
under a small driver, which reads the memory figures and the mixture's
time per EM iteration (``DMMixture.iter_s``) from inside: the options are
the CLI's, ``--k K --n-init 1 --n-screen 0 --max-iter M --progress``, one
K-component EM run with its progress bar.

    python scripts/gpu/big_sparse_fit.py                      # on the GPU machine
    python scripts/gpu/big_sparse_fit.py --rows 5000 --cols 500 --device cpu   # smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_now() -> int:
    """This process's resident set now, bytes (0 where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # (KiB on Linux)


def child(result_path: str, cli_args) -> int:
    """The fit's process: the CLI's main with the measurements around it."""
    import torch
    import dirmult_ext
    from dirmult_ext.cli import fit as fit_cli
    from dirmult_ext.models import mixture
    from dirmult_ext import io
    from dirmult_ext.data.row_stream import matrix_bytes
    cuda = "cuda" in " ".join(cli_args)
    if cuda:
        torch.zeros(1, device="cuda")                 # (the context, in the base RSS)
        torch.cuda.reset_peak_memory_stats()
    info = {"base_rss": _rss_now()}
    if True:  # (on any device, so that the CPU smoke test runs it too)
        # The same fit once on a tiny matrix first: the libraries and kernels
        # it loads (host memory that does not grow with the data) are in
        # warm_rss, the base the data's share is measured from.
        import numpy as np
        import scipy.sparse
        rng = np.random.default_rng(0)
        tiny = scipy.sparse.random(300, 40, density=0.2, format="csr", random_state=rng,
                                   data_rvs=lambda n: rng.integers(1, 9, n)).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "tiny.npz")
            scipy.sparse.save_npz(path, tiny)
            k_at = cli_args.index("--k") + 1
            warm_args = [path] + cli_args[1:k_at] + ["2"] + cli_args[k_at + 1:]
            fit_cli.main(warm_args)
        info["warm_rss"] = _rss_now()
    # (main imports these when called: the wrappers below are the ones it runs)
    real_fit, real_load = mixture.fit_mixture, io.load_count_table

    def load(*a, **k):
        t0 = time.perf_counter()
        table = real_load(*a, **k)
        info.update(load_s=time.perf_counter() - t0, csr_bytes=matrix_bytes(table.counts),
                    nnz=int(table.counts.nnz) if hasattr(table.counts, "nnz") else None,
                    shape=list(table.counts.shape), counts_type=type(table.counts).__name__,
                    rss_after_load=_rss_now(), peak_rss_after_load=_peak_rss())
        return table

    def fit_mixture(*a, **k):
        info["rss_fit_start"] = _rss_now()
        t0 = time.perf_counter()
        m = real_fit(*a, **k)
        info.update(fit_s=time.perf_counter() - t0, iter_s=m.iter_s, n_iter=m.n_iter,
                    converged=bool(m.converged), log_lik=m.log_lik)
        return m

    io.load_count_table = load
    mixture.fit_mixture = fit_mixture
    rc = fit_cli.main(cli_args)
    info.update(rc=rc, peak_rss=_peak_rss(), version=dirmult_ext.__version__)
    if cuda:
        info["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
    with open(result_path, "w") as f:
        json.dump(info, f)
    return rc


def run_fit(path: str, label: str, a, batch_size=None) -> dict:
    cli = [path, "--k", str(a.k), "--n-init", "1", "--n-screen", "0", "--max-iter",
           str(a.max_iter), "--seed", "0", "--device", a.device, "--progress"]
    if batch_size:
        cli += ["--batch-size", str(batch_size)]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    print(f"=== {label}: dirmult-ext fit {' '.join(cli)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", result_path,
                           "--", *cli])
    wall = time.perf_counter() - t0
    with open(result_path) as f:
        r = json.load(f) if os.path.getsize(result_path) else {}
    os.unlink(result_path)
    r.update(label=label, wall_s=wall, returncode=proc.returncode, cli=cli,
             batch_size=batch_size)
    csr = r.get("csr_bytes") or 0
    if csr:
        r["rss_over_csr"] = r["peak_rss"] / csr
        r["rss_above_base_over_csr"] = (r["peak_rss"] - r["base_rss"]) / csr
        if "warm_rss" in r:
            r["rss_above_warm_over_csr"] = (r["peak_rss"] - r["warm_rss"]) / csr
    gpu = r.get("peak_gpu_bytes")
    nan = float("nan")
    base = "torch and the CUDA context" if a.device.startswith("cuda") else "torch"
    print(f"bigfit {label}: rc {proc.returncode}, wall {wall:.1f} s, load "
          f"{r.get('load_s', nan):.1f} s, fit {r.get('fit_s', nan):.1f} s, "
          f"{r.get('n_iter')} EM iterations at {r.get('iter_s', nan):.3f} s; peak RSS "
          f"{r.get('peak_rss', 0) / 1e9:.2f} GB = {r.get('rss_over_csr', nan):.2f}x the CSR "
          f"bytes ({csr / 1e9:.2f} GB; {r.get('rss_above_base_over_csr', nan):.2f}x above the "
          f"{r.get('base_rss', 0) / 1e9:.2f} GB of {base}); peak GPU "
          + ("n/a" if gpu is None else f"{gpu / 1e9:.2f} GB")
          + ("" if "warm_rss" not in r else
             f"; {r['rss_above_warm_over_csr']:.2f}x the CSR bytes above the "
             f"{r['warm_rss'] / 1e9:.2f} GB after the same fit on a tiny matrix; RSS "
             f"{r.get('rss_after_load', 0) / 1e9:.2f} GB after loading, "
             f"{r.get('rss_fit_start', 0) / 1e9:.2f} GB as the fit starts"), flush=True)
    return r


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=50_000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--max-iter", type=int, default=30, help="EM iterations per run")
    p.add_argument("--batch-size", type=int, default=200_000,
                   help="rows per block of the streamed run (0: no streamed run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dir", default=None, help="where the matrix goes (default: a new "
                   "folder under /tmp, removed at the end)")
    p.add_argument("--json", default=None, help="results (default $OUT/bigfit.json if OUT)")
    a = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from write_sparse_matrix import write
    workdir = a.dir or tempfile.mkdtemp(prefix="dirmult_bigfit_", dir="/tmp")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "mixture.npz")
    t0 = time.perf_counter()
    m = write(path, "mixture", a.rows, a.cols, k=a.k, seed=0)
    write_s = time.perf_counter() - t0
    nnz = int(m.nnz)
    del m
    print(f"bigfit write: {a.rows} x {a.cols}, {nnz} nonzeros ({nnz / (a.rows * a.cols):.3%}), "
          f"k = {a.k}, {write_s:.1f} s", flush=True)
    out = {"rows": a.rows, "cols": a.cols, "k": a.k, "nnz": nnz, "write_s": write_s,
           "device": a.device, "runs": []}
    try:
        out["runs"].append(run_fit(path, "on device", a))
        if a.batch_size:
            out["runs"].append(run_fit(path, f"streamed ({a.batch_size} rows a block)", a,
                                       a.batch_size))
    finally:
        if a.dir is None:
            for name in os.listdir(workdir):
                os.unlink(os.path.join(workdir, name))
            os.rmdir(workdir)
    dest = a.json or (os.path.join(os.environ["OUT"], "bigfit.json") if os.environ.get("OUT")
                      else None)
    if dest:
        with open(dest, "w") as f:
            json.dump(out, f, indent=1)
        print(f"bigfit: results in {dest}")
    return 0 if all(r["returncode"] == 0 and r.get("rc") == 0 for r in out["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
