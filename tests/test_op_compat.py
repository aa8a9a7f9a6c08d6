"""Every dirmult op inside PyTorch's machinery: torch.library.opcheck of each
op on every device under test (schema, fake kernel, autograd registration,
AOT dispatch), torch.compile (static and dynamic shapes, no graph breaks),
torch.jit.script (saved, then loaded in a fresh process), torch.export; the
gradients there against the float64 formula."""
import subprocess
import sys
import textwrap
from typing import Optional

import pytest
import torch

import dirmult_ext

from reference import grad_float64, log_lik_float64, magnitudes, random_counts


def _opcheck_cases(op, device):
    """Argument tuples for each op: shared and per-sample concentrations,
    normalize on and off, float and uint8 counts, float32 and float64, and
    rows enough for the single pass's kernels (CPU: 64)."""
    counts = random_counts((6, 9), torch.float32, device)
    many = random_counts((70, 9), torch.float32, device)
    la = torch.randn(9, device=device, requires_grad=True)
    la_ps = torch.randn(6, 9, device=device, requires_grad=True)
    la_k = torch.randn(3, 9, device=device, requires_grad=True)
    fcounts = (counts + torch.rand_like(counts)).requires_grad_()
    grad = torch.randn(6, device=device)
    d = lambda t: t.detach().double()  # noqa: E731
    return {
        "log_lik": [(counts, la, False), (counts, la_ps, True), (fcounts, la, True),
                    (counts.to(torch.uint8), la.detach(), False),
                    (d(counts), d(la).requires_grad_(), True)],
        "log_lik_backward": [(grad, counts, la.detach(), False, True),
                             (grad, counts, la_ps.detach(), True, False),
                             (d(grad), d(counts), d(la), True, True)],
        "log_lik_with_grad": [(counts, la.detach(), True), (many, la.detach(), False),
                              (d(many), d(la), True)],
        "log_lik_components": [(counts, la_k, False), (counts, la_k, True),
                               (d(counts), d(la_k).requires_grad_(), False)],
        "log_lik_components_backward": [(torch.randn(6, 3, device=device), counts, la_k.detach()),
                                        (torch.randn(6, 3, device=device).double(), d(counts),
                                         d(la_k))],
        "poch_terms": [(torch.randn(10, device=device), torch.rand(10, device=device) * 20),
                       (torch.randn(10, device=device).double(),
                        torch.randint(0, 17, (10,), device=device).double())],
        "tpoch_terms": [(torch.randn(10, device=device), torch.rand(10, device=device) * 20),
                        (torch.randn(10, device=device).double(),
                         torch.randint(0, 17, (10,), device=device).double())],
        "log_lik_csr": [_csr_parts(counts) + (la, False), _csr_parts(counts) + (la_k, True),
                        _csr_parts(d(counts)) + (d(la).requires_grad_(), True)],
        "log_lik_csr_backward": [_csr_backward_args(grad, counts, la.detach()),
                                 _csr_backward_args(torch.randn(6, 3, device=device), counts,
                                                    la_k.detach()),
                                 _csr_backward_args(d(grad), d(counts), d(la))],
        "log_lik_csr_with_grad": [_csr_parts(counts) + (la.detach(), False),
                                  _csr_parts(d(counts)) + (d(la).detach(), True)],
        "log_lik_regression": [(counts, *_design(6, 9, 4, device), False),
                               (counts, *_design(6, 9, 4, device, bias=False), True),
                               (counts.to(torch.uint8), *_design(6, 9, 2, device, grad=False), True),
                               (d(counts), *_design(6, 9, 3, device, torch.float64), True),
                               (counts, *_design(6, 9, 65, device), False)],
        "log_lik_regression_backward": [
            (grad, counts, *_design(6, 9, 4, device, grad=False), False),
            (grad, counts, *_design(6, 9, 4, device, bias=False, grad=False), True),
            (d(grad), d(counts), *_design(6, 9, 3, device, torch.float64, grad=False), True),
            (grad, counts, *_design(6, 9, 65, device, grad=False), False)],
    }[op]


def _design(B, V, P, device, dtype=torch.float32, bias=True, grad=True):
    """log_lik_regression's (X, W, bias) with log_alpha within about (-2, 2)."""
    X = torch.randn(B, P, dtype=dtype, device=device)
    W = torch.randn(P, V, dtype=dtype, device=device) * (0.5 / P ** 0.5)
    b = torch.randn(V, dtype=dtype, device=device) * 0.5 if bias else None
    return tuple(t.requires_grad_(grad) if t is not None else None for t in (X, W, b))


def _csr_parts(counts):
    """A dense (B, V) matrix's CSR parts (crow, col, values), int64 indices."""
    t = counts.to_sparse_csr()
    # Clones: views of a sparse tensor's parts are not plain tensors to the
    # fake-tensor tracing of some torch releases.
    return t.crow_indices().clone(), t.col_indices().clone(), t.values().clone()


def _csr_backward_args(grad, counts, log_alpha):
    from dirmult_ext.ops.csr import csc_parts
    crow, col, values = _csr_parts(counts)
    return (grad, crow, values, *csc_parts(crow, col, values, counts.shape[1]), log_alpha)


OPS = ["log_lik", "log_lik_backward", "log_lik_with_grad", "log_lik_components",
       "log_lik_components_backward", "poch_terms", "tpoch_terms", "log_lik_csr",
       "log_lik_csr_backward", "log_lik_csr_with_grad",
       "log_lik_regression", "log_lik_regression_backward"]


def test_every_op_is_checked():
    """OPS names every op the library defines (a new op needs its cases)."""
    defined = {name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
               if name.startswith("dirmult::")}
    assert defined == set(OPS)


# The CSR single pass has a CPU kernel only (CUDA takes the forward and the
# backward ops: Note [Single pass]).
CPU_ONLY = {"log_lik_csr_with_grad"}


@pytest.mark.parametrize("op", OPS)
def test_opcheck(device, op):
    if device.type != "cpu" and op in CPU_ONLY:
        with pytest.raises(NotImplementedError, match="CUDA"):
            getattr(torch.ops.dirmult, op).default(*_opcheck_cases(op, device)[0])
        return
    for args in _opcheck_cases(op, device):
        torch.library.opcheck(getattr(torch.ops.dirmult, op).default, args)


def _fn(counts, log_alpha):
    return dirmult_ext.log_lik(counts, log_alpha, normalize=True).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(_fn, fullgraph=True, dynamic=dynamic)
    for B, V in [(8, 16), (13, 16), (5, 40)]:
        counts = random_counts((B, V), torch.float32, device)
        la = torch.randn(V, device=device, requires_grad=True)
        out = compiled(counts, la)
        g, = torch.autograd.grad(out, la)
        la2 = la.detach().clone().requires_grad_()
        ref = _fn(counts, la2)
        g_ref, = torch.autograd.grad(ref, la2)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(g, g_ref)


def test_compile_no_graph_breaks(device):
    torch._dynamo.reset()
    counts = random_counts((8, 16), torch.float32, device)
    la = torch.randn(16, device=device, requires_grad=True)
    explanation = torch._dynamo.explain(_fn)(counts, la)
    assert explanation.graph_break_count == 0


def test_export(device):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.log_alpha = torch.nn.Parameter(torch.randn(12))

        def forward(self, counts):
            return dirmult_ext.log_lik(counts, self.log_alpha)

    model = Model().to(device)
    counts = random_counts((7, 12), torch.float32, device)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, (counts,), dynamic_shapes={"counts": {0: batch}})
    assert any("dirmult" in str(n.target) for n in ep.graph.nodes)
    counts2 = random_counts((11, 12), torch.float32, device)
    torch.testing.assert_close(ep.module()(counts2), model(counts2))


@torch.jit.script
def scripted_nll(counts: torch.Tensor, log_alpha: torch.Tensor) -> torch.Tensor:
    return -torch.ops.dirmult.log_lik(counts, log_alpha, False).mean()


def test_jit_script_function(device):
    counts = random_counts((9, 14), torch.float32, device)
    la = torch.randn(14, device=device)
    torch.testing.assert_close(scripted_nll(counts, la), -dirmult_ext.log_lik(counts, la).mean())


def test_jit_script_module_saved_and_loaded_in_fresh_process(tmp_path, device):
    model = torch.jit.script(dirmult_ext.DirichletMultinomialLogLik(10, torch.randn(10)))
    path = tmp_path / "dm.pt"
    model.save(str(path))
    counts = random_counts((6, 10), torch.float32, "cpu")
    torch.save(counts, tmp_path / "counts.pt")
    expected = model(counts)
    code = textwrap.dedent(f"""
        import torch, dirmult_ext
        m = torch.jit.load({str(path)!r}, map_location={str(device)!r})
        c = torch.load({str(tmp_path / 'counts.pt')!r}).to({str(device)!r})
        print(repr(m(c).cpu().tolist()))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = torch.tensor(eval(res.stdout.strip()))
    torch.testing.assert_close(got, expected.cpu())
    assert torch.allclose(expected.double(), log_lik_float64(counts, model.log_alpha.detach()), rtol=1e-5)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_module_reduction_eager_and_scripted(device, reduction):
    model = dirmult_ext.DirichletMultinomialLogLik(12, torch.randn(12), reduction=reduction)
    model = model.to(device)
    scripted = torch.jit.script(model)
    counts = random_counts((70, 12), torch.float32, device)
    rows = dirmult_ext.log_lik(counts, model.log_alpha.detach())
    expected = rows.sum() if reduction == "sum" else rows.mean()
    # The gradient, eager and scripted, against the float64 formula relative
    # to the columns' terms (CPU, seen: 1e-7 over 10 draws; tolerance 5x;
    # CUDA: the single pass's bound in test_log_lik_with_grad.py).
    w = torch.full((70,), 1.0 if reduction == "sum" else 1.0 / 70, dtype=torch.float64)
    ref = grad_float64(counts, model.log_alpha, w)
    scale = magnitudes(counts, model.log_alpha)[1] * w[0]
    tol = 5e-7 if device.type == "cpu" else 2e-6
    for m in (model, scripted):
        out = m(counts)
        assert out.shape == ()
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=0.0)
        g, = torch.autograd.grad(out, m.log_alpha)
        assert ((g.double().cpu() - ref).abs() / scale).max() < tol
    assert f"reduction='{reduction}'" in repr(model)
    with pytest.raises(ValueError, match="reduction must be one of"):
        dirmult_ext.DirichletMultinomialLogLik(12, reduction="avg")


# ------------------------------------------------------------ log_lik_regression
def _regression_loss(counts, X, W, bias):
    return dirmult_ext.log_lik_regression(counts, X, W, bias, normalize=True).sum()


def _regression_float64(counts, X, W, bias):
    la = X.detach().double().cpu() @ W.detach().double().cpu() + bias.detach().double().cpu()
    return log_lik_float64(counts, la, True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_regression_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(_regression_loss, fullgraph=True, dynamic=dynamic)
    for B, V, P in [(8, 16, 3), (13, 16, 3), (5, 40, 3)]:
        counts = random_counts((B, V), torch.float32, device)
        X, W, b = _design(B, V, P, device)
        out = compiled(counts, X, W, b)
        grads = torch.autograd.grad(out, (X, W, b))
        eager = [t.detach().clone().requires_grad_() for t in (X, W, b)]
        ref = _regression_loss(counts, *eager)
        torch.testing.assert_close(out, ref)
        for g, r in zip(grads, torch.autograd.grad(ref, eager)):
            torch.testing.assert_close(g, r)
        assert abs(out.item() - _regression_float64(counts, X, W, b).sum().item()) < 1e-3


def test_regression_compile_no_graph_breaks(device):
    torch._dynamo.reset()
    counts = random_counts((8, 16), torch.float32, device)
    explanation = torch._dynamo.explain(_regression_loss)(counts, *_design(8, 16, 3, device))
    assert explanation.graph_break_count == 0


def test_regression_export(device):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.W = torch.nn.Parameter(torch.randn(4, 12) * 0.3)
            self.bias = torch.nn.Parameter(torch.randn(12) * 0.3)

        def forward(self, counts, X):
            return dirmult_ext.log_lik_regression(counts, X, self.W, self.bias)

    model = Model().to(device)
    counts = random_counts((7, 12), torch.float32, device)
    X = torch.randn(7, 4, device=device)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, (counts, X),
                             dynamic_shapes={"counts": {0: batch}, "X": {0: batch}})
    assert any("log_lik_regression" in str(n.target) for n in ep.graph.nodes)
    counts2 = random_counts((11, 12), torch.float32, device)
    X2 = torch.randn(11, 4, device=device)
    torch.testing.assert_close(ep.module()(counts2, X2), model(counts2, X2))


@torch.jit.script
def scripted_regression(counts: torch.Tensor, X: torch.Tensor, W: torch.Tensor,
                        bias: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ops.dirmult.log_lik_regression(counts, X, W, bias, True)


@pytest.mark.parametrize("with_bias", [True, False])
def test_regression_jit_script(device, with_bias):
    counts = random_counts((9, 14), torch.float32, device)
    X, W, b = _design(9, 14, 5, device, bias=with_bias, grad=False)
    torch.testing.assert_close(scripted_regression(counts, X, W, b),
                               dirmult_ext.log_lik_regression(counts, X, W, b, normalize=True))
