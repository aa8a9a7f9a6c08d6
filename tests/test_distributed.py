"""Data-parallel fitting: 2 CPU processes with gloo give the single-process
fit on the concatenated rows (same iterations; parameters equal up to the
order of floating-point summation)."""
import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dirmult_ext
from dirmult_ext.likelihood.distribution import DirichletMultinomial
from dirmult_ext import fit

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(dirmult_ext.__file__)))
SPLIT = 137            # rank 0 holds rows [0, 137), rank 1 the rest: uneven shards


def _worker(rank, world, init_file, data_file, out_dir):
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    from dirmult_ext.models.distributed import fit_distributed
    try:
        d = torch.load(data_file)
        x, w = d["x"], d["w"]
        sl = slice(0, SPLIT) if rank == 0 else slice(SPLIT, None)
        out = {}
        r = fit_distributed(x[sl])
        out["newton"] = (r.log_alpha, r.log_lik, r.n_iter, r.converged, r.n_rows)
        r = fit_distributed(x[sl], weights=w[sl], method="fixed_point", max_iter=3000,
                            batch_size=40)
        out["fixed_point_weighted"] = (r.log_alpha, r.log_lik, r.n_iter, r.converged, r.n_rows)
        # rank 1 holds no rows at all
        sl = slice(None) if rank == 0 else slice(0, 0)
        r = fit_distributed(x[sl])
        out["empty_shard"] = (r.log_alpha, r.log_lik, r.n_iter, r.converged, r.n_rows)
        # categories disagree: every rank raises
        try:
            fit_distributed(x[:, :5] if rank == 0 else x[:, :6])
            out["mismatch"] = "no error"
        except ValueError as e:
            out["mismatch"] = str(e)
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _data(B=400, V=9):
    alpha = torch.rand(V, dtype=torch.float64) * 2 + 0.2
    x = DirichletMultinomial(torch.randint(5, 80, (B,)), alpha).sample().float()
    w = torch.rand(B, dtype=torch.float64) * 2
    return x, w


def test_two_gloo_ranks_equal_single_process(tmp_path):
    x, w = _data()
    data_file = str(tmp_path / "data.pt")
    torch.save({"x": x, "w": w}, data_file)
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), data_file, str(tmp_path)), nprocs=2,
             join=True)
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    refs = {"newton": fit(x),
            "fixed_point_weighted": fit(x, weights=w, method="fixed_point", max_iter=3000),
            "empty_shard": fit(x)}
    for name, ref in refs.items():
        for r in range(2):
            la, ll, n_iter, conv, n_rows = res[r][name]
            assert conv and n_rows == x.shape[0], (name, r)
            # tolerance: sums over shards in another order, ~1e-13 relative per pass
            assert math.isclose(ll, ref.log_lik, rel_tol=1e-11), (name, ll, ref.log_lik)
            torch.testing.assert_close(la, ref.log_alpha, rtol=0, atol=1e-8)
            if name != "fixed_point_weighted":   # a linear method may stop one step apart
                assert n_iter == ref.n_iter
        # both ranks hold bit-identical parameters (they took identical steps)
        assert torch.equal(res[0][name][0], res[1][name][0])
    for r in range(2):
        assert "same number of categories" in res[r]["mismatch"]


@pytest.mark.slow  # (processes of their own: runs in CI, `-m slow`)
def test_torchrun_launcher(tmp_path):
    """``torchrun --nproc_per_node=2 -m dirmult_ext.cli.distributed FILE`` equals fit(FILE)."""
    x, _ = _data(B=300, V=7)
    f = str(tmp_path / "counts.npy")
    np.save(f, x.numpy())
    out = str(tmp_path / "params.npz")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1",
               PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={port}",
           "-m", "dirmult_ext.cli.distributed", f, "--device", "cpu", "--out", out]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "world size 2 (gloo)" in p.stdout
    got = np.load(out)
    ref = fit(x)
    np.testing.assert_allclose(got["log_alpha"], ref.log_alpha.numpy(), rtol=0, atol=1e-8)
    assert math.isclose(float(got["log_lik"]), ref.log_lik, rel_tol=1e-11)


def test_requires_process_group():
    from dirmult_ext.models.distributed import fit_distributed, shard_rows
    assert not dist.is_initialized()          # the spawned ranks had their own groups
    with pytest.raises(RuntimeError, match="process group"):
        fit_distributed(torch.ones(3, 2))
    parts = [shard_rows(10, r, 3) for r in range(3)]
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 6), (6, 10)]
