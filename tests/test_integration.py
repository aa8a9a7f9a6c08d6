"""The ops inside PyTorch's machinery: opcheck, torch.compile (static and
dynamic shapes, no graph breaks), torch.jit.script (saved, then loaded in a
fresh process), torch.export."""
import subprocess
import sys
import textwrap

import pytest
import torch

import dirmult_ext

from reference import log_lik_float64
from test_values import random_counts


def _opcheck_cases(device):
    counts = random_counts((6, 9), torch.float32, device)
    la = torch.randn(9, device=device, requires_grad=True)
    la_ps = torch.randn(6, 9, device=device, requires_grad=True)
    la_k = torch.randn(3, 9, device=device, requires_grad=True)
    fcounts = (counts + torch.rand_like(counts)).requires_grad_()
    grad = torch.randn(6, device=device)
    return [
        (torch.ops.dirmult.log_lik.default, (counts, la, False)),
        (torch.ops.dirmult.log_lik.default, (counts, la_ps, True)),
        (torch.ops.dirmult.log_lik.default, (fcounts, la, True)),
        (torch.ops.dirmult.log_lik.default, (counts.to(torch.uint8), la.detach(), False)),
        (torch.ops.dirmult.log_lik_backward.default, (grad, counts, la.detach(), False, True)),
        (torch.ops.dirmult.log_lik_backward.default, (grad, counts, la_ps.detach(), True, False)),
        (torch.ops.dirmult.log_lik_with_grad.default, (counts, la.detach(), True)),
        (torch.ops.dirmult.log_lik_with_grad.default,
         (random_counts((40, 9), torch.float32, device), la.detach(), False)),
        (torch.ops.dirmult.log_lik_components.default, (counts, la_k, False)),
        (torch.ops.dirmult.log_lik_components_backward.default,
         (torch.randn(6, 3, device=device), counts, la_k.detach())),
        (torch.ops.dirmult.poch_terms.default, (torch.randn(10, device=device), counts[0, :10].clone()
                                                if counts.shape[1] >= 10 else torch.rand(10, device=device) * 5)),
    ]


def test_opcheck(device):
    for op, args in _opcheck_cases(device):
        torch.library.opcheck(op, args)


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
    # and the loaded module trains (autograd through the op)
    assert torch.allclose(expected.double(), log_lik_float64(counts, model.log_alpha.detach()), rtol=1e-5)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_module_reduction_eager_and_scripted(device, reduction):
    model = dirmult_ext.DirichletMultinomialLogLik(12, torch.randn(12), reduction=reduction)
    model = model.to(device)
    scripted = torch.jit.script(model)
    counts = random_counts((70, 12), torch.float32, device)
    rows = dirmult_ext.log_lik(counts, model.log_alpha.detach())
    expected = rows.sum() if reduction == "sum" else rows.mean()
    for m in (model, scripted):
        out = m(counts)
        assert out.shape == ()
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=0.0)
        g, = torch.autograd.grad(out, m.log_alpha)
        assert torch.isfinite(g).all()
    assert f"reduction='{reduction}'" in repr(model)
    with pytest.raises(ValueError, match="reduction must be one of"):
        dirmult_ext.DirichletMultinomialLogLik(12, reduction="avg")
