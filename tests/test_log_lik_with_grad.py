"""dirmult::log_lik_with_grad (the forward and the gradient of the rows' sum
in one read of the counts) against float64, and the autograd single pass
that uses it: a sum of the rows takes the saved gradient, any other
incoming gradient the full backward."""
import pytest
import torch

import dirmult_ext
from dirmult_ext.ops import dense as _dense, dispatch as _dispatch, library as _ops

from reference import grad_float64, log_lik_float64, magnitudes as _magnitudes, random_counts

with_grad = torch.ops.dirmult.log_lik_with_grad.default


def _grad_of_sum_float64(counts, log_alpha, normalize, weights=None):
    return grad_float64(counts, log_alpha, weights, normalize)


def _rel(x, ref, scale=None):
    """Largest error relative to `scale` (default: the largest |ref|, at least 1)."""
    if scale is None:
        scale = ref.abs().max().clamp_min(1.0)
    return ((x.double().cpu() - ref).abs() / scale.clamp_min(1.0)).max().item()


def _mixed_counts(B, V, device, dtype):
    """Mostly small integers, with counts off the table: large, non-integer
    (float dtypes) and zero rows."""
    counts = random_counts((B, V), torch.float64, "cpu", high=12)
    big = torch.rand(B, V) < 0.02
    counts[big] = torch.randint(17, 5000, (int(big.sum()),)).double()
    if dtype.is_floating_point:
        frac = torch.rand(B, V) < 0.02
        counts[frac] += torch.rand(int(frac.sum())).double()
    counts[min(3, B - 1)] = 0
    if dtype == torch.uint8:
        counts = counts.clamp(max=255).floor()
    elif not dtype.is_floating_point:
        counts = counts.floor()
    return counts.to(dtype=dtype, device=device)


# Shapes around the kernels' limits: one row and a few (the CPU op falls
# back to a forward and a backward below 64 rows), one row batch, column
# counts that are not a multiple of 4 or of the 1024-column chunk, several
# chunks, rows tiled, and few rows over 64 chunks or more (on CUDA the
# single pass's blocks fill their own table slices).
@pytest.mark.parametrize("B,V", [(1, 2051), (5, 33), (40, 7), (64, 1024), (333, 1031),
                                 (97, 2500), (2100, 130), (3, 66000), (2, 70001)])
@pytest.mark.parametrize("normalize", [False, True])
def test_values_and_gradient_match_float64(device, B, V, normalize):
    counts = _mixed_counts(B, V, device, torch.float32)
    la = torch.empty(V).uniform_(-4, 5).to(device)
    out, grad = with_grad(counts, la, normalize)
    assert out.shape == (B,) and grad.shape == (V,)
    assert out.dtype == grad.dtype == torch.float32
    rows, cols = _magnitudes(counts, la, normalize)
    assert _rel(out, log_lik_float64(counts, la, normalize), rows) < 2e-6
    assert _rel(grad, _grad_of_sum_float64(counts, la, normalize), cols) < 2e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.uint8,
                                   torch.float16])
@pytest.mark.parametrize("B,V", [(70, 300), (2, 66001)])
def test_count_dtypes(device, dtype, B, V):
    counts = _mixed_counts(B, V, device, dtype)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    la = torch.empty(V, dtype=compute).uniform_(-3, 4).to(device)
    out, grad = with_grad(counts, la, False)
    tol = 1e-12 if compute == torch.float64 else 2e-6
    rows, cols = _magnitudes(counts, la)
    assert _rel(out, log_lik_float64(counts, la), rows) < tol
    assert _rel(grad, _grad_of_sum_float64(counts, la, False), cols) < tol


def test_batch_dims_and_empty(device):
    counts = _mixed_counts(6 * 11, 50, device, torch.float32).reshape(6, 11, 50)
    la = torch.randn(50, device=device)
    out, grad = with_grad(counts, la, False)
    assert out.shape == (6, 11)
    rows, cols = _magnitudes(counts, la)
    assert _rel(out, log_lik_float64(counts, la), rows) < 2e-6
    assert _rel(grad, _grad_of_sum_float64(counts.reshape(-1, 50), la, False), cols) < 2e-6
    out, grad = with_grad(counts[:0], la, False)
    assert out.shape == (0, 11) and torch.equal(grad, torch.zeros_like(la))


def test_bad_counts_give_nan_rows_and_gradient(device):
    counts = _mixed_counts(64, 300, device, torch.float32)
    counts[5, 7] = -1.0
    counts[9, 250] = float("nan")
    out, grad = with_grad(counts, torch.randn(300, device=device), False)
    bad = torch.zeros(64, dtype=torch.bool)
    bad[[5, 9]] = True
    assert out.cpu()[bad].isnan().all() and out.cpu()[~bad].isfinite().all()
    assert grad.isnan().all()  # a bad count poisons the gradient, as in the backward


def test_deterministic(device):
    counts = _mixed_counts(500, 1500, device, torch.float32)
    la = torch.randn(1500, device=device)
    a = with_grad(counts, la, True)
    b = with_grad(counts, la, True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ----------------------------------------------------- the autograd single pass
def _autograd_case(device, B=300, V=700):
    counts = _mixed_counts(B, V, device, torch.float32)
    la = torch.empty(V).uniform_(-3, 3).to(device).requires_grad_()
    return counts, la


@pytest.mark.parametrize("loss", ["sum", "scaled_sum", "weighted", "mean", "batch_sum",
                                  "masked", "uniform_weights"])
def test_gradient_through_autograd_matches_float64(device, loss):
    counts, la = _autograd_case(device)
    out = dirmult_ext.log_lik(counts, la)
    weights = None
    if loss == "sum":
        total = out.sum()
    elif loss == "scaled_sum":
        total = -0.25 * out.sum()
        weights = torch.full((out.numel(),), -0.25)
    elif loss == "weighted":
        weights = torch.rand(out.numel())
        total = (out * weights.to(device)).sum()
    elif loss == "mean":
        total = out.mean()
        weights = torch.full((out.numel(),), 1.0 / out.numel())
    elif loss == "masked":  # most rows weigh 0 (skipped unread), the rest 1
        weights = (torch.rand(out.numel()) < 0.1).float()
        total = (out * weights.to(device)).sum()
    elif loss == "uniform_weights":  # dense, every weight the same
        weights = torch.full((out.numel(),), 0.3)
        total = (out * weights.to(device)).sum()
    else:  # rows in a (3, 100) batch, the gradient of the sum still expanded
        out = dirmult_ext.log_lik(counts.reshape(3, 100, -1), la)
        total = out.sum()
    g, = torch.autograd.grad(total, la)
    ref = _grad_of_sum_float64(counts, la, False, weights)
    scale = 1.0 if weights is None else weights.abs().max()
    assert _rel(g, ref, scale * _magnitudes(counts, la)[1]) < 2e-6


@pytest.mark.skipif(not _dispatch.FAST_PATH,
                    reason="the single pass is the eager fast path's (DIRMULT_FAST_PATH=0)")
def test_single_pass_is_taken_where_it_applies(device):
    counts, la = _autograd_case(device)
    ll = dirmult_ext.log_lik(counts, la)
    saved = ll.grad_fn.grad_of_sum
    assert saved is not None
    # The saved gradient is the gradient of the sum, bit for bit what the
    # backward returns for it.
    g, = torch.autograd.grad(ll.sum(), la)
    assert torch.equal(g, saved)
    # Too few rows for the single-pass kernels (CPU: 64; CUDA serves one):
    # the plain forward.
    min_rows = _dense.SINGLE_PASS_MIN_ROWS_CUDA if counts.is_cuda else _dense.SINGLE_PASS_MIN_ROWS_CPU
    few = dirmult_ext.log_lik(counts[:min_rows - 1], la)
    assert few.grad_fn.grad_of_sum is None
    one = dirmult_ext.log_lik(counts[:1], la)
    assert (one.grad_fn.grad_of_sum is not None) == counts.is_cuda
    # Not where counts need a gradient, or under no_grad.
    fcounts = counts.clone().requires_grad_()
    assert dirmult_ext.log_lik(fcounts, la).grad_fn.grad_of_sum is None
    with torch.no_grad():
        assert dirmult_ext.log_lik(counts, la).grad_fn is None


@pytest.mark.skipif(not _dispatch.FAST_PATH,
                    reason="the single pass is the eager fast path's (DIRMULT_FAST_PATH=0)")
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_reduction_takes_the_single_pass(device, reduction):
    counts, la = _autograd_case(device)
    red = dirmult_ext.log_lik(counts, la, reduction=reduction)
    out = dirmult_ext.log_lik(counts, la.detach())
    ref = out.sum() if reduction == "sum" else out.mean()
    assert red.shape == () and red.dtype == torch.float32
    torch.testing.assert_close(red, ref, rtol=1e-6, atol=0.0)
    node = red.grad_fn
    while not hasattr(node, "grad_of_sum"):  # (DivBackward0 ->) SumBackward0 -> log_lik
        node = node.next_functions[0][0]
    saved = node.grad_of_sum
    assert saved is not None
    g, = torch.autograd.grad(red, la)
    scale = torch.ones((), device=device) / (1 if reduction == "sum" else out.numel())
    assert torch.equal(g, saved * scale)  # the saved gradient, scaled: no second read
    # Against the float64 formula, relative to the columns' terms (seen:
    # 1.5e-7 for both reductions; the same tolerance as above).
    weights = torch.full((out.numel(),), float(scale))
    _, cols = _magnitudes(counts, la)
    assert _rel(g, _grad_of_sum_float64(counts, la, False, weights), float(scale) * cols) < 2e-6


def test_reduction_none_empty_and_bad():
    counts = torch.zeros(0, 5)
    la = torch.zeros(5)
    assert dirmult_ext.log_lik(counts, la, reduction="sum").item() == 0.0
    assert torch.isnan(dirmult_ext.log_lik(counts, la, reduction="mean"))
    c = torch.randint(0, 5, (4, 5)).float()
    assert torch.equal(dirmult_ext.log_lik(c, la, reduction="none"), dirmult_ext.log_lik(c, la))
    with pytest.raises(ValueError, match="reduction must be one of 'none', 'sum', 'mean'"):
        dirmult_ext.log_lik(c, la, reduction="avg")


def test_uniform_gradient_detection():
    assert _dispatch.is_uniform(torch.ones(()).expand(7))
    assert _dispatch.is_uniform(torch.ones(()).expand(3, 4))
    assert _dispatch.is_uniform(torch.ones(1))
    assert not _dispatch.is_uniform(torch.ones(7))
    assert not _dispatch.is_uniform(torch.ones(3, 1).expand(3, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B,V", [(70, 300), (6, 3000)])
def test_zero_weight_rows_do_not_enter_the_gradient(device, dtype, B, V):
    """A row whose incoming gradient is 0 is skipped, bad counts and all (no
    0 * NaN): masked rows of bad data leave the gradient finite."""
    counts = _mixed_counts(B, V, device, dtype)
    la = torch.empty(V, dtype=dtype).uniform_(-3, 3).to(device).requires_grad_()
    weights = (torch.rand(B) < 0.5).to(dtype)
    weights[0], weights[1] = 0.0, 1.0
    bad = counts.clone()
    bad[0, 3] = float("nan")
    bad[weights.to(device) == 0, 5] = -2.0
    out = dirmult_ext.log_lik(bad, la)
    assert out[0].isnan().item()
    g, = torch.autograd.grad(out, la, weights.to(device))
    assert g.isfinite().all()
    ref = _grad_of_sum_float64(counts[weights.to(device) == 1],
                               la, False)
    tol = 1e-10 if dtype == torch.float64 else 2e-6
    assert _rel(g, ref, _magnitudes(counts[weights.to(device) == 1], la)[1]) < tol


def test_zero_weight_rows_in_components(device):
    counts = _mixed_counts(50, 40, device, torch.float32)
    counts[7, 2] = float("nan")
    la = torch.randn(3, 40, device=device, requires_grad=True)
    weights = torch.rand(50, 3, device=device)
    weights[7] = 0.0
    out = dirmult_ext.log_lik_components(counts, la)
    g, = torch.autograd.grad(out, la, weights)
    keep = torch.arange(50, device=device) != 7
    la2 = la.detach().clone().requires_grad_()
    g_ref, = torch.autograd.grad(dirmult_ext.log_lik_components(counts[keep], la2), la2,
                                 weights[keep])
    assert g.isfinite().all()
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_single_pass_equals_forward_and_backward_bitwise(dtype, normalize):
    """On CPU the single pass adds the same terms in the same order as the
    forward and the backward with unit weights: the same bits."""
    counts = _mixed_counts(300, 700, "cpu", dtype)
    la = torch.empty(700, dtype=dtype).uniform_(-3, 3)
    out, grad = with_grad(counts, la, normalize)
    assert torch.equal(out, torch.ops.dirmult.log_lik(counts, la, normalize))
    ones = torch.ones(300, dtype=dtype)
    g_ref, _ = torch.ops.dirmult.log_lik_backward(ones, counts, la, normalize, False)
    assert torch.equal(grad, g_ref)


def test_edge_layouts(device):
    """One count vector (a 0-d result), no categories, and strided inputs."""
    counts = _mixed_counts(1, 9, device, torch.float32)[0]
    la = torch.randn(9, device=device)
    out, grad = with_grad(counts, la, True)
    assert out.shape == () and grad.shape == (9,)
    assert _rel(out, log_lik_float64(counts, la, True)) < 2e-6
    assert _rel(grad, _grad_of_sum_float64(counts.unsqueeze(0), la, True),
                _magnitudes(counts.unsqueeze(0), la)[1]) < 2e-6

    out, grad = with_grad(torch.zeros(5, 0, device=device), torch.zeros(0, device=device), False)
    assert torch.equal(out, torch.zeros(5, device=device)) and grad.shape == (0,)

    wide = _mixed_counts(80, 2 * 300, device, torch.float32)
    counts, la = wide[:, ::2], torch.randn(600, device=device)[1::2]  # neither contiguous
    out, grad = with_grad(counts, la, False)
    rows, cols = _magnitudes(counts, la)
    assert _rel(out, log_lik_float64(counts, la), rows) < 2e-6
    assert _rel(grad, _grad_of_sum_float64(counts, la, False), cols) < 2e-6
