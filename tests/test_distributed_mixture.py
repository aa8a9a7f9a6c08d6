"""The data-parallel mixture fit: 2 CPU processes with gloo give the
single-process fit_mixture of the concatenated rows from the same seed
(parameters equal up to the order of floating-point summation)."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dirmult_ext
from dirmult_ext import fit
from dirmult_ext.models.mixture import fit_mixture
from dirmult_ext.models.starts import random_responsibilities
from reference import separated_mixture

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(dirmult_ext.__file__)))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "gpu",
                      "multigpu_fit_check.sh")
SPLIT = 137            # rank 0 holds rows [0, 137), rank 1 the rest: uneven shards
MIX = dict(n_init=2, n_screen=4, screen_iter=2, seed=7, tol=1e-10)
LONG = dict(n_init=1, n_screen=0, seed=7, tol=1e-10)   # k=4 on 3 clusters: ~50 iterations
K1 = dict(n_init=1, tol=1e-15, max_iter=100, seed=0)


def _result(m):
    return dict(weights=m.weights, log_alpha=m.log_alpha, log_lik=m.log_lik, n_iter=m.n_iter,
                R=m.responsibilities, restarts=m.restart_log_liks, bic=m.bic,
                laplace=m.laplace)


def _worker(rank, world, init_file, data_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    from dirmult_ext.models.distributed import fit_distributed
    from dirmult_ext.models.distributed_mixture import fit_mixture_distributed as fmd
    try:
        x = torch.load(data_file)["x"]
        sl = slice(0, SPLIT) if rank == 0 else slice(SPLIT, None)
        out = {"dense": _result(fmd(x[sl], 3, **MIX))}
        csr = scipy.sparse.csr_matrix(x.numpy())
        out["sparse"] = _result(fmd(csr[sl], 3, batch_size=64, **MIX))   # (streamed)
        out["kmeans"] = _result(fmd(x[sl], 3, init="kmeans++", **MIX))
        out["kmeans_sparse"] = _result(fmd(csr[sl], 3, init="kmeans++", **MIX))
        # k-means++ on a sample of 100 rows: the same fit on 2 ranks as on 1
        out["sampled"] = _result(fmd(x[sl], 3, init="kmeans++", kmeans_sample=100, **MIX))
        solo = dist.new_group([0])
        if rank == 0:
            out["sampled_one_rank"] = _result(fmd(x, 3, init="kmeans++", kmeans_sample=100,
                                                  group=solo, **MIX))
        out["seedless"] = _result(fmd(x[sl], 2, n_init=1, n_screen=0, seed=None))
        out["long"] = _result(fmd(x[sl], 4, **LONG))
        out["prior"] = _result(fmd(x[sl], 2, n_init=1, prior="dmn", seed=3))
        # rank 1 holds no rows at all
        out["empty"] = _result(fmd(x if rank == 0 else x[:0], 3, n_init=1, seed=1))
        m = fmd(x[sl], 1, **K1)
        d = fit_distributed(x[sl], tol=1e-14)
        out["k1"] = (m.log_alpha[0], m.log_lik, d.log_alpha, d.log_lik)
        errors = {}
        for name, kw in {"k": dict(k=0 if rank == 1 else 2),
                         "k_differs": dict(k=2 + rank),
                         "init": dict(k=2, init="spectral" if rank == 0 else "random"),
                         "columns": dict(k=2, local_counts=x[sl, :5 + rank])}.items():
            kw.setdefault("local_counts", x[sl])
            try:
                fmd(kw.pop("local_counts"), kw.pop("k"), n_init=1, **kw)
                errors[name] = "no error"
            except (ValueError, TypeError) as e:
                errors[name] = str(e)
        out["errors"] = errors
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distmix")
    x, _, _ = separated_mixture(B=400, V=12, K=3, seed=4)
    torch.save({"x": x}, str(tmp / "data.pt"))
    mp.spawn(_worker, args=(2, str(tmp / "init"), str(tmp / "data.pt"), str(tmp)), nprocs=2,
             join=True)
    return x, [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


def _assert_same_fit(got, ref, shards):
    # tolerance: sums over shards in another order, ~1e-16 relative per pass
    assert abs(got["log_lik"] - ref.log_lik) <= 1e-10 * abs(ref.log_lik)
    torch.testing.assert_close(got["log_alpha"], ref.log_alpha, rtol=0, atol=1e-7)
    torch.testing.assert_close(got["weights"], ref.weights, rtol=0, atol=1e-7)
    assert got["n_iter"] == ref.n_iter
    np.testing.assert_allclose(got["restarts"], ref.restart_log_liks, rtol=1e-10)
    torch.testing.assert_close(got["R"], ref.responsibilities[shards], rtol=0, atol=1e-7)
    assert math.isclose(got["bic"], ref.bic, rel_tol=1e-10)
    assert math.isclose(got["laplace"], ref.laplace, rel_tol=1e-8)


@pytest.mark.parametrize("case", ["dense", "sparse", "long"])
def test_two_ranks_equal_fit_mixture(two_ranks, case):
    x, res = two_ranks
    if case == "long":
        ref = fit_mixture(x, 4, init="random", **LONG)
        assert ref.n_iter > 20
    else:
        ref = fit_mixture(x if case == "dense" else scipy.sparse.csr_matrix(x.numpy()), 3,
                          init="random", **MIX)
    for r, shard in enumerate([slice(0, SPLIT), slice(SPLIT, None)]):
        _assert_same_fit(res[r][case], ref, shard)
    # both ranks took identical steps: bit-identical parameters
    assert torch.equal(res[0][case]["log_alpha"], res[1][case]["log_alpha"])


@pytest.mark.parametrize("case", ["kmeans", "kmeans_sparse"])
def test_kmeanspp_on_every_row_is_fit_mixtures(two_ranks, case):
    x, res = two_ranks
    ref = fit_mixture(x if case == "kmeans" else scipy.sparse.csr_matrix(x.numpy()), 3,
                      init="kmeans++", **MIX)
    for r, shard in enumerate([slice(0, SPLIT), slice(SPLIT, None)]):
        _assert_same_fit(res[r][case], ref, shard)


def test_kmeanspp_on_a_sample_does_not_depend_on_the_world_size(two_ranks):
    _, res = two_ranks
    one, two = res[0]["sampled_one_rank"], res[0]["sampled"]
    assert abs(one["log_lik"] - two["log_lik"]) <= 1e-10 * abs(one["log_lik"])
    torch.testing.assert_close(two["log_alpha"], one["log_alpha"], rtol=0, atol=1e-7)
    torch.testing.assert_close(two["R"], one["R"][:SPLIT], rtol=0, atol=1e-7)
    torch.testing.assert_close(res[1]["sampled"]["R"], one["R"][SPLIT:], rtol=0, atol=1e-7)


def test_seed_none_is_drawn_once_for_all_ranks(two_ranks):
    _, res = two_ranks
    assert torch.equal(res[0]["seedless"]["log_alpha"], res[1]["seedless"]["log_alpha"])
    assert res[0]["seedless"]["log_lik"] == res[1]["seedless"]["log_lik"]


def test_prior_and_empty_shard(two_ranks):
    x, res = two_ranks
    ref = fit_mixture(x, 2, n_init=1, prior="dmn", seed=3, init="random")
    for r, shard in enumerate([slice(0, SPLIT), slice(SPLIT, None)]):
        _assert_same_fit(res[r]["prior"], ref, shard)
    ref = fit_mixture(x, 3, n_init=1, seed=1, init="random")
    _assert_same_fit(res[0]["empty"], ref, slice(None))
    _assert_same_fit(res[1]["empty"], ref, slice(0, 0))


def test_one_component_is_the_dm_fit(two_ranks):
    x, res = two_ranks
    for r in range(2):
        la, ll, la_dm, ll_dm = res[r]["k1"]
        assert math.isclose(ll, ll_dm, rel_tol=1e-10)
        torch.testing.assert_close(la, la_dm, rtol=0, atol=1e-6)
    torch.testing.assert_close(res[0]["k1"][0], fit(x, tol=1e-14).log_alpha, rtol=0, atol=1e-6)


def test_bad_argument_on_one_rank_raises_on_all(two_ranks):
    _, res = two_ranks
    e0, e1 = res[0]["errors"], res[1]["errors"]
    assert "k must be a positive integer" in e1["k"] and "rank 1" in e0["k"]
    assert "k must be a positive integer" in e0["k"]
    for e in (e0, e1):
        assert "k must be the same on every rank" in e["k_differs"]
        assert "number of categories" in e["columns"] and "same on every rank" in e["columns"]
    assert "init must be 'kmeans++' or 'random'" in e0["init"] and "rank 0" in e1["init"]


def test_random_starts_depend_on_the_row_only():
    whole = random_responsibilities(0, 9000, 4, seed=5, stream=2)
    assert whole.shape == (9000, 4) and whole.dtype == torch.float64
    torch.testing.assert_close(whole.sum(-1), torch.ones(9000, dtype=torch.float64))
    for s, e in [(0, 1), (4000, 4200), (4095, 8193), (8999, 9000), (7, 7)]:
        assert torch.equal(random_responsibilities(s, e, 4, seed=5, stream=2), whole[s:e])
    assert not torch.equal(random_responsibilities(0, 10, 4, seed=5, stream=3), whole[:10])


def test_requires_process_group():
    from dirmult_ext.models.distributed_mixture import fit_mixture_distributed
    with pytest.raises(RuntimeError, match="process group"):
        fit_mixture_distributed(torch.ones(3, 2), 2)


@pytest.mark.slow  # (processes of their own: runs in CI, `-m slow`)
@pytest.mark.skipif(not os.path.exists(SCRIPT), reason="run from a source checkout")
def test_multigpu_script_on_cpu():
    """scripts/gpu/multigpu_fit_check.sh end to end on the CPU at a tiny size:
    the DM and the 10-component mixture, 1 process against 2 under torchrun."""
    env = dict(os.environ, PY=sys.executable, MULTIGPU_DEVICE="cpu", MULTIGPU_ROWS="600",
               MULTIGPU_COLS="40",
               PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("dm", "mixture"):
        assert f"{name}: 2-process fit matches the 1-process fit" in p.stdout, p.stdout
        assert f"{name}: time per iteration" in p.stdout and "speedup" in p.stdout
