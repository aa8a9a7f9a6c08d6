"""The eager fast path's one door to torch's private dispatcher APIs
(``dirmult_ext.ops.dispatch``): where torch lacks them, or with
``DIRMULT_FAST_PATH=0``, every call takes the registered op, with the same
values and gradients. Each variant runs in a process of its own, since the
choice is made on import."""
import json
import os
import subprocess
import sys

import pytest
import torch

import dirmult_ext
from dirmult_ext.ops import dispatch

from reference import log_lik_float64

# Values and gradients of log_lik, log_lik_components and log_lik_regression
# (and a sum's single pass) from a child process, as JSON.
_CHILD = r"""
import json, sys
import torch
HIDE = sys.argv[1]
if HIDE:  # a torch that moved one of the private names
    delattr(torch._C, HIDE)
import dirmult_ext
from dirmult_ext.ops import dispatch
g = torch.Generator().manual_seed(int(sys.argv[2]))
counts = torch.randint(0, 7, (80, 9), generator=g).to(torch.float64)
la = torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True)
lak = torch.randn(3, 9, generator=g, dtype=torch.float64, requires_grad=True)
X = torch.randn(80, 2, generator=g, dtype=torch.float64)
W = torch.randn(2, 9, generator=g, dtype=torch.float64, requires_grad=True)
ll = dirmult_ext.log_lik(counts, la)
(g_sum,) = torch.autograd.grad(ll.sum(), la, retain_graph=True)
(g_w,) = torch.autograd.grad((ll * torch.linspace(0, 1, 80, dtype=torch.float64)).sum(), la)
llk = dirmult_ext.log_lik_components(counts, lak)
(g_k,) = torch.autograd.grad(llk.sum(), lak)
llr = dirmult_ext.log_lik_regression(counts, X, W)
(g_r,) = torch.autograd.grad(llr.sum(), W)
print(json.dumps({"fast_path": dispatch.FAST_PATH,
                  **{k: v.detach().tolist() for k, v in dict(
                      ll=ll, g_sum=g_sum, g_w=g_w, llk=llk, g_k=g_k, llr=llr, g_r=g_r).items()}}))
"""


def _child(env_value, hide="", seed=0):
    env = dict(os.environ)
    env.pop("DIRMULT_FAST_PATH", None)
    if env_value is not None:
        env["DIRMULT_FAST_PATH"] = env_value
    p = subprocess.run([sys.executable, "-c", _CHILD, hide, str(seed)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# (torch's own register_autograd and autograd need the other private names:
# only one that the fast path alone uses can go missing without breaking torch.)
@pytest.mark.parametrize("env_value, hide", [("0", ""), (None, "_dispatch_tls_local_include_set")])
def test_public_path_gives_the_fast_paths_values_and_gradients(env_value, hide):
    seed = int(torch.randint(0, 2 ** 31 - 1, ()))
    fast, public = _child(None, seed=seed), _child(env_value, hide, seed=seed)
    assert fast["fast_path"] is True and public["fast_path"] is False
    for key in ("ll", "g_sum", "g_w", "llk", "g_k", "llr", "g_r"):
        torch.testing.assert_close(torch.tensor(public[key], dtype=torch.float64),
                                   torch.tensor(fast[key], dtype=torch.float64),
                                   rtol=1e-12, atol=1e-12, msg=key)
    # ... and both are the log-likelihood, not just the same numbers.
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 7, (80, 9), generator=g).to(torch.float64)
    la = torch.randn(9, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(public["ll"], dtype=torch.float64), log_lik_float64(counts, la),
                               rtol=1e-10, atol=1e-10)


def test_fast_path_is_on_where_torch_has_the_names():
    assert dispatch.FAST_PATH is (os.environ.get("DIRMULT_FAST_PATH", "1") != "0")
    assert dirmult_ext.log_lik(torch.ones(2, 3), torch.zeros(3)).shape == (2,)
