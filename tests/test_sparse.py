"""Sparse counts (CSR ops, SparseCounts, conversions): agreement with the
dense path and the float64 formula, gradients, determinism, validation, and
the ops inside PyTorch's machinery (opcheck, torch.compile, TorchScript)."""
import math
import numpy as np
import pytest
import torch

import dirmult_ext
from dirmult_ext import SparseCounts
from dirmult_ext.ops.csr import csc_parts

from reference import (component_magnitudes, components_float64, log_lik_float64, magnitudes,
                       random_sparse_counts)

scipy_sparse = pytest.importorskip("scipy.sparse")
ops = torch.ops.dirmult

TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


def _close_to_float64(out, counts, la, normalize, compute):
    """out within TOL of the float64 formula relative to the rows' magnitudes."""
    ref = log_lik_float64(counts, la, normalize)
    rows, _ = magnitudes(counts, la, normalize)
    err = ((out.detach().double().cpu() - ref).abs() / rows.clamp_min(1.0))
    assert err.numel() == 0 or err.max() < TOL[compute]


def _forms(dense, device):
    """The same counts in every sparse input form."""
    csr = dense.to_sparse_csr()
    m = scipy_sparse.csr_matrix(dense.cpu().numpy())
    forms = {
        "torch_csr": csr,
        "torch_coo": dense.to_sparse(),
        "torch_csc": dense.to_sparse_csc(),
        "sparse_counts": SparseCounts.from_dense(dense),
    }
    if device.type == "cpu":
        forms.update({"scipy_csr": m, "scipy_csc": m.tocsc(), "scipy_coo": m.tocoo(),
                      "scipy_coo_duplicates": _coo_with_duplicates(m)})
    return forms


def _coo_with_duplicates(m):
    """m as COO with every stored value split into two entries (summed on
    conversion)."""
    coo = m.tocoo()
    half = coo.data / 2
    return scipy_sparse.coo_matrix(
        (np.concatenate([half, coo.data - half]), (np.concatenate([coo.row, coo.row]),
                                                   np.concatenate([coo.col, coo.col]))),
        shape=m.shape)


@pytest.mark.parametrize("density", [0.0, 0.02, 0.3, 1.0])
@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_every_form_matches_dense_and_float64(device, density, compute):
    B, V = 37, 53
    dense = random_sparse_counts(B, V, density).to(compute)
    dense[5] = 0.0  # an all-zero row
    dense[6] = 0.0
    dense[6, 17] = 4.0  # a row with one nonzero
    dense = dense.to(device)
    la = (torch.randn(V, dtype=compute) * 1.5).to(device)
    for normalize in (False, True):
        expected = dirmult_ext.log_lik(dense, la, normalize=normalize)
        for name, form in _forms(dense, device).items():
            out = dirmult_ext.log_lik(form, la, normalize=normalize)
            assert out.shape == (B,) and out.dtype == compute and out.device == dense.device, name
            _close_to_float64(out, dense, la, normalize, compute)
            # (both within TOL of the float64 formula)
            assert ((out - expected).abs().cpu().double()
                    / magnitudes(dense, la, normalize)[0].clamp_min(1.0)).max() < 2 * TOL[compute]
            assert out[5] == 0.0  # an empty row: no terms, lnpoch(A, 0) = log 0! = 0


@pytest.mark.parametrize("count_dtype", [torch.float32, torch.float64, torch.float16,
                                         torch.int32, torch.int64, torch.uint8])
def test_count_dtypes(device, count_dtype):
    B, V = 20, 31
    dense = random_sparse_counts(B, V, 0.25, dtype=torch.float64, max_count=9).round()
    dense = dense.clamp(max=200).to(count_dtype).to(device)
    la = torch.randn(V, device=device)
    out = dirmult_ext.log_lik(dense.to_sparse_csr(), la, normalize=True)
    expected_dtype = torch.float64 if count_dtype == torch.float64 else torch.float32
    assert out.dtype == expected_dtype
    _close_to_float64(out, dense, la, True, expected_dtype)
    torch.testing.assert_close(out, dirmult_ext.log_lik(dense, la, normalize=True),
                               rtol=1e-5, atol=1e-4)


def test_scipy_index_dtypes_and_int_values():
    dense = random_sparse_counts(15, 40, 0.2).round()
    la = torch.randn(40)
    m = scipy_sparse.csr_matrix(dense.numpy().astype(np.int64))
    for index in (np.int32, np.int64):
        m.indptr, m.indices = m.indptr.astype(index), m.indices.astype(index)
        sc = SparseCounts.from_scipy(m)
        assert sc.crow_indices.dtype == (torch.int32 if index == np.int32 else torch.int64)
        out = dirmult_ext.log_lik(m, la)
        assert out.dtype == torch.float32
        _close_to_float64(out, dense, la, False, torch.float32)


@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_components_match_dense_and_float64(device, compute):
    B, V, K = 29, 45, 5
    dense = random_sparse_counts(B, V, 0.15).to(compute)
    dense[3] = 0.0
    dense = dense.to(device)
    la = torch.randn(K, V, dtype=compute, device=device)
    for normalize in (False, True):
        ref = components_float64(dense, la, normalize)
        scale = component_magnitudes(dense, la, normalize).clamp_min(1.0)
        for form in (dense.to_sparse_csr(), SparseCounts.from_dense(dense)):
            out = dirmult_ext.log_lik_components(form, la, normalize=normalize)
            assert out.shape == (B, K) and out.dtype == compute
            assert ((out.double().cpu() - ref).abs() / scale).max() < TOL[compute]
        dense_out = dirmult_ext.log_lik_components(dense, la, normalize=normalize)
        assert ((out - dense_out).abs().double().cpu() / scale).max() < 2 * TOL[compute]


def test_shapes_at_the_edges(device):
    la = torch.randn(7, device=device)
    # B = 0
    empty = torch.zeros(0, 7, device=device).to_sparse_csr()
    out = dirmult_ext.log_lik(empty, la)
    assert out.shape == (0,)
    assert dirmult_ext.log_lik_components(empty, la[None].expand(3, 7)).shape == (0, 3)
    # nnz = 0 (every row empty): log-likelihood 0, gradient 0
    zeros = torch.zeros(4, 7, device=device)
    la_g = la.clone().requires_grad_()
    out = dirmult_ext.log_lik(zeros.to_sparse_csr(), la_g)
    assert torch.equal(out, torch.zeros(4, device=device))
    g, = torch.autograd.grad(out.sum(), la_g)
    assert torch.equal(g, torch.zeros(7, device=device))
    # V = 1
    one = torch.tensor([[3.0], [0.0], [7.5]], device=device)
    la1 = torch.randn(1, device=device)
    _close_to_float64(dirmult_ext.log_lik(one.to_sparse_csr(), la1, normalize=True), one, la1,
                      True, torch.float32)


def test_one_long_row(device):
    V = 100_000
    dense = torch.zeros(3, V)
    dense[1] = torch.randint(1, 30, (V,)).float()  # 10^5 nonzeros in one row
    dense[2, ::1000] = 2.0
    la = torch.randn(V) - 2.0
    dense, la = dense.to(device), la.to(device)
    out = dirmult_ext.log_lik(dense.to_sparse_csr(), la, normalize=True)
    _close_to_float64(out, dense, la, True, torch.float32)


def test_bad_values_make_their_row_nan(device):
    dense = random_sparse_counts(6, 9, 0.5).to(device)
    dense[1, 2] = -1.0
    dense[3, 4] = float("nan")
    dense[4, 0] = float("inf")
    la = torch.randn(9, device=device)
    out = dirmult_ext.log_lik(dense.to_sparse_csr(), la)
    bad = torch.tensor([False, True, False, True, True, False])
    assert out[bad.to(device)].isnan().all()
    assert out[~bad.to(device)].isfinite().all()
    with pytest.raises(ValueError, match="negative"):
        dirmult_ext.log_lik(dense.abs().nan_to_num(posinf=1.0).to_sparse_csr() * -1, la,
                            validate=True)
    with pytest.raises(ValueError, match="NaN or infinite"):
        dirmult_ext.log_lik(dense.to_sparse_csr(), la, validate=True)


def test_non_finite_log_alpha_makes_every_row_nan(device):
    dense = random_sparse_counts(5, 8, 0.5).to(device)
    la = torch.randn(8, device=device)
    la[3] = float("inf")
    assert dirmult_ext.log_lik(dense.to_sparse_csr(), la).isnan().all()


# ------------------------------------------------------------------ gradients
def _weighted_grad(counts, la, weights, normalize=False):
    la = la.detach().clone().requires_grad_()
    fn = dirmult_ext.log_lik if la.dim() == 1 else dirmult_ext.log_lik_components
    out = fn(counts, la, normalize=normalize)
    g, = torch.autograd.grad((out * weights).sum(), la)
    return g


def test_gradcheck_float64(device):
    dense = random_sparse_counts(9, 11, 0.4).double().to(device)
    dense[2] = 0.0
    sc = SparseCounts.from_dense(dense)
    la = torch.randn(11, dtype=torch.float64, device=device, requires_grad=True)
    la_k = torch.randn(3, 11, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda l: dirmult_ext.log_lik(sc, l, normalize=True), (la,))
    assert torch.autograd.gradcheck(lambda l: dirmult_ext.log_lik_components(sc, l), (la_k,))


@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_gradient_matches_float64_reference_autograd(device, compute):
    B, V = 40, 60
    dense = random_sparse_counts(B, V, 0.1).to(device)
    dense[7] = 0.0
    la = torch.randn(V, dtype=compute, device=device)
    w = torch.randn(B, dtype=compute, device=device)
    w[3] = 0.0
    g = _weighted_grad(SparseCounts.from_dense(dense), la, w)
    la64 = la.detach().double().cpu().requires_grad_()
    ref, = torch.autograd.grad((log_lik_float64(dense, la64) * w.double().cpu()).sum(), la64)
    _, cols = magnitudes(dense, la)
    scale = (cols * w.abs().max().double().cpu()).clamp_min(1e-3)
    assert ((g.double().cpu() - ref).abs() / scale).max() < 10 * TOL[compute]
    dense_g = _weighted_grad(dense, la, w)
    assert ((g - dense_g).abs().double().cpu() / scale).max() < 10 * TOL[compute]


def test_components_gradient_matches_dense(device):
    B, V, K = 33, 27, 4
    dense = random_sparse_counts(B, V, 0.2).to(device)
    la = torch.randn(K, V, device=device)
    w = torch.randn(B, K, device=device)
    g = _weighted_grad(dense.to_sparse_csr(), la, w)
    ref = torch.stack([_weighted_grad(dense, la[k], w[:, k]) for k in range(K)])
    torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-4)


def test_gradient_bitwise_deterministic(device):
    B, V = 300, 200
    dense = random_sparse_counts(B, V, 0.05).to(device)
    dense[:, 3] = torch.randint(0, 50, (B,)).float().to(device)  # a long column
    la = torch.randn(V, device=device)
    la_k = torch.randn(6, V, device=device)
    w = torch.randn(B, device=device)
    w_k = torch.randn(B, 6, device=device)
    fresh = [_weighted_grad(SparseCounts.from_dense(dense), la, w) for _ in range(3)]
    sc = SparseCounts.from_dense(dense)
    kept = [_weighted_grad(sc, la, w) for _ in range(3)]  # the kept column-sorted copy
    for g in fresh[1:] + kept:
        assert torch.equal(g, fresh[0])
    gk = [_weighted_grad(sc, la_k, w_k) for _ in range(3)]
    assert torch.equal(gk[0], gk[1]) and torch.equal(gk[0], gk[2])
    if device.type == "cpu":
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(_weighted_grad(sc, la, w), fresh[0])
        finally:
            torch.set_num_threads(threads)


def test_rows_do_not_depend_on_other_rows(device):
    dense = random_sparse_counts(50, 80, 0.2).to(device)
    la = torch.randn(80, device=device)
    whole = dirmult_ext.log_lik(dense.to_sparse_csr(), la)
    part = dirmult_ext.log_lik(dense[10:13].to_sparse_csr(), la)
    assert torch.equal(whole[10:13], part)


@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_forward_table_rows_equal_math_rows(device, compute):
    # 400 rows of 50 columns at 30%: more nonzeros than table entries (16 V K),
    # so the kernels read the small counts' lnpoch from the table (Note [CSR
    # tables]); ten of the rows alone are too few for it and take the math.
    # Each row's sum has one order either way, and the entries are the
    # exact path's values, so the rows agree bit for bit.
    dense = random_sparse_counts(400, 50, 0.3).to(compute).to(device)
    la = torch.randn(3, 50, dtype=compute, device=device) - 0.5
    sc = SparseCounts.from_dense(dense)
    for normalize in (False, True):
        whole = dirmult_ext.log_lik_components(sc, la, normalize=normalize)
        part = dirmult_ext.log_lik_components(sc[20:30], la, normalize=normalize)
        if device.type == "cpu":
            assert torch.equal(whole[20:30], part)
        scale = component_magnitudes(dense[20:30], la, normalize).clamp_min(1.0)
        assert ((whole[20:30] - part).abs().double().cpu() / scale).max() < 2 * TOL[compute]
        ref = components_float64(dense, la, normalize)
        scale = component_magnitudes(dense, la, normalize).clamp_min(1.0)
        assert ((whole.double().cpu() - ref).abs() / scale).max() < TOL[compute]


def _single_pass_case(B=300, V=60, density=0.1, compute=torch.float32):
    dense = random_sparse_counts(B, V, density).to(compute)
    dense[:, 4] = torch.randint(0, 30, (B,)).to(compute)  # a long column
    dense[7] = 0.0
    return dense, torch.randn(V, dtype=compute) - 0.5


@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
def test_single_pass_matches_forward_and_backward_ops(compute, normalize):
    device = torch.device("cpu")  # (the single pass has a CPU kernel only)
    dense, la = _single_pass_case(compute=compute)
    dense, la = dense.to(device), la.to(device)
    sc = SparseCounts.from_dense(dense)
    out, g = ops.log_lik_csr_with_grad(sc.crow_indices, sc.col_indices, sc.values, la,
                                       normalize)
    assert torch.equal(out, ops.log_lik_csr(sc.crow_indices, sc.col_indices, sc.values, la,
                                            normalize))
    ptr, rows, vals = csc_parts(sc.crow_indices, sc.col_indices, sc.values, la.shape[0])
    two_pass = ops.log_lik_csr_backward(torch.ones_like(out), sc.crow_indices, sc.values,
                                        ptr, rows, vals, la)
    cols = magnitudes(dense, la)[1]
    err = (g - two_pass).abs().double().cpu() / cols.clamp_min(1e-3)
    assert err.max() < 20 * TOL[compute]
    la64 = la.double().requires_grad_(True)
    ref = torch.autograd.grad(log_lik_float64(dense, la64, normalize).sum(), la64)[0]
    assert ((g.double().cpu() - ref.cpu()).abs() / cols.clamp_min(1e-3)).max() < 20 * TOL[compute]


@pytest.mark.parametrize("form", ["prepared", "torch_csr"])
def test_single_pass_serves_sums_without_the_column_sorted_copy(monkeypatch, form):
    import dirmult_ext.data.sparse_counts as counts_module
    import dirmult_ext.ops.csr as csr_module
    dense, la = _single_pass_case()
    calls = []
    build = csr_module.csc_parts

    def counted(*args):
        calls.append(1)
        return build(*args)
    for module in (csr_module, counts_module):
        monkeypatch.setattr(module, "csc_parts", counted)
    sc = SparseCounts.from_dense(dense)
    counts = sc if form == "prepared" else dense.to_sparse_csr()
    if form == "torch_csr":
        sc = counts_module.as_sparse_counts(counts)
    leaf = la.clone().requires_grad_(True)
    out = dirmult_ext.log_lik(counts, leaf)
    g_sum = torch.autograd.grad(out.sum(), leaf)[0]
    g_scaled = torch.autograd.grad(3.0 * dirmult_ext.log_lik(counts, leaf).sum(), leaf)[0]
    assert calls == [] and sc._csc is None
    _, direct = ops.log_lik_csr_with_grad(sc.crow_indices, sc.col_indices, sc.values, la)
    assert torch.equal(g_sum, direct) and torch.equal(g_scaled, 3.0 * direct)
    # A weighted sum takes the backward op, over the copy built then and kept.
    w = torch.rand(dense.shape[0])
    g_w = torch.autograd.grad((dirmult_ext.log_lik(counts, leaf) * w).sum(), leaf)[0]
    assert calls == [1] and sc._csc is not None
    ptr, rows, vals = build(sc.crow_indices, sc.col_indices, sc.values, la.shape[0])
    assert torch.equal(g_w, ops.log_lik_csr_backward(w, sc.crow_indices, sc.values, ptr, rows,
                                                     vals, la))
    w2 = torch.rand(dense.shape[0])
    g_w2 = torch.autograd.grad((dirmult_ext.log_lik(counts, leaf) * w2).sum(), leaf)[0]
    assert calls == [1]
    assert torch.equal(g_w2, ops.log_lik_csr_backward(w2, sc.crow_indices, sc.values, ptr, rows,
                                                      vals, la))


def test_single_pass_bitwise_deterministic_and_thread_independent():
    dense, la = _single_pass_case(B=9000, V=40, density=0.2)  # three row blocks
    sc = SparseCounts.from_dense(dense)
    runs = [ops.log_lik_csr_with_grad(sc.crow_indices, sc.col_indices, sc.values, la)
            for _ in range(3)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        runs.append(ops.log_lik_csr_with_grad(sc.crow_indices, sc.col_indices, sc.values, la))
    finally:
        torch.set_num_threads(threads)
    for out, g in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(g, runs[0][1])


def test_single_pass_bad_values_and_edges():
    device = torch.device("cpu")  # (the single pass has a CPU kernel only)
    dense, la = _single_pass_case(B=80, V=30)
    dense[5, 2] = -1.0
    sc = SparseCounts.from_dense(dense.to(device))
    out, g = ops.log_lik_csr_with_grad(sc.crow_indices, sc.col_indices, sc.values, la.to(device))
    assert out[5].isnan() and not out[6].isnan() and g.isnan().all()
    empty = SparseCounts.from_dense(torch.zeros(0, 30, device=device))
    out, g = ops.log_lik_csr_with_grad(empty.crow_indices, empty.col_indices, empty.values,
                                       la.to(device))
    assert out.shape == (0,) and torch.equal(g, torch.zeros(30, device=device))
    with pytest.raises(RuntimeError, match="shape \\(V,\\)"):
        ops.log_lik_csr_with_grad(sc.crow_indices, sc.col_indices, sc.values,
                                  torch.randn(2, 30, device=device))


def test_kept_column_sorted_copy(device):
    dense = random_sparse_counts(12, 10, 0.3).to(device)
    sc = SparseCounts.from_dense(dense)
    first = sc.csc()
    assert sc.csc() is first
    ptr, rows, vals = first
    assert ptr.shape == (11,) and rows.shape == vals.shape == (sc.nnz,)
    # the copy holds the same matrix, columns in order, rows increasing in each
    rebuilt = torch.zeros(12, 10, dtype=vals.dtype, device=device)
    cols = torch.repeat_interleave(torch.arange(10, device=device), (ptr[1:] - ptr[:-1]).long())
    rebuilt[rows.long(), cols] = vals
    assert torch.equal(rebuilt, dense.to(vals.dtype))


def test_no_gradient_with_respect_to_counts(device):
    dense = random_sparse_counts(4, 6, 0.5).to(device)
    la = torch.randn(6, device=device)
    with pytest.raises(ValueError, match="no gradient"):
        dirmult_ext.log_lik(dense.to_sparse_csr().requires_grad_(), la)
    csr = dense.to_sparse_csr()
    values = csr.values().clone().requires_grad_()
    out = ops.log_lik_csr(csr.crow_indices(), csr.col_indices(), values, la, False)
    with pytest.raises(NotImplementedError, match="no gradient with respect to the counts"):
        out.sum().backward()


# ----------------------------------------------------------------- validation
def _parts(device):
    dense = torch.tensor([[0, 2, 0, 1], [0, 0, 0, 0], [5, 0, 3, 0]], dtype=torch.float32)
    csr = dense.to(device).to_sparse_csr()
    return csr.crow_indices(), csr.col_indices(), csr.values()


def test_valid_parts_pass(device):
    crow, col, val = _parts(device)
    SparseCounts(crow, col, val, (3, 4), validate=True)


@pytest.mark.parametrize("edit, match", [
    (lambda c, j, v: (c, torch.tensor([1, 4, 0, 2]), v), r"col_indices must be in \[0, V\)"),
    (lambda c, j, v: (c, torch.tensor([1, -1, 0, 2]), v), r"col_indices must be in \[0, V\)"),
    (lambda c, j, v: (c, torch.tensor([3, 1, 0, 2]), v), "col_indices must be sorted"),
    (lambda c, j, v: (c, torch.tensor([1, 1, 0, 2]), v), "distinct"),
    (lambda c, j, v: (torch.tensor([0, 2, 1, 4]), j, v), "crow_indices must be non-decreasing"),
    (lambda c, j, v: (torch.tensor([0, 2, 2, 3]), j, v), "crow_indices must end at"),
    (lambda c, j, v: (torch.tensor([1, 2, 2, 4]), j, v), "crow_indices must start at 0"),
])
def test_structure_errors_name_the_argument(device, edit, match):
    crow, col, val = edit(*(t.cpu() for t in _parts(device)))
    crow, col, val = crow.to(device), col.to(device), val.to(device)
    with pytest.raises(ValueError, match=match):
        SparseCounts(crow, col, val, (3, 4), validate=True)
    bad = torch.sparse_csr_tensor(crow, col, val, (3, 4), check_invariants=False)
    with pytest.raises(ValueError, match=match):
        dirmult_ext.log_lik(bad, torch.zeros(4, device=device), validate=True)


def test_structure_checks_in_blocks_find_every_error(monkeypatch):
    # The CPU checks go ROW_BLOCK_NNZ values at a time: an error on either
    # side of a block boundary, or straddling it, is found and reported as
    # the whole-matrix check reports it; a row starting at a boundary is not
    # mistaken for a step back.
    from dirmult_ext.data import sparse_counts as sparse
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = (torch.rand(12, 10, generator=g) < 0.5).double() * 3
    x[[4, 5]] = 0.0
    x[0, :2] = 1.0
    csr = x.to_sparse_csr()
    crow, col = csr.crow_indices(), csr.col_indices()
    nnz = col.numel()
    starts = crow[:-1][crow[1:] > crow[:-1]]

    def message(c):
        try:
            sparse._check_structure(crow, c, (12, 10))
        except ValueError as e:
            return str(e)
        return None

    whole = {}
    edits = []
    for j in range(1, nnz):
        if j in starts:
            continue
        down, same, out = col.clone(), col.clone(), col.clone()
        down[j] = -1 if col[j - 1] == 0 else col[j - 1] - 1
        same[j] = col[j - 1]
        out[j] = 10
        edits += [down, same, out]
    edits.append(col)
    for c in edits:
        whole[id(c)] = message(c)
    assert whole[id(col)] is None
    assert sum(m is not None for m in whole.values()) == len(edits) - 1
    for block in (1, 2, 7, 16):
        monkeypatch.setattr(sparse, "ROW_BLOCK_NNZ", block)
        for c in edits:
            assert message(c) == whole[id(c)], block
    two = col.clone()  # a duplicate early, a column out of range late
    two[1], two[nnz - 1] = two[0], 99
    monkeypatch.setattr(sparse, "ROW_BLOCK_NNZ", 3)
    assert message(two) == (f"col_indices must be in [0, V) = [0, 10), got 99 at "
                            f"position {nnz - 1}")


def test_metadata_errors(device):
    crow, col, val = _parts(device)
    la = torch.zeros(4, device=device)
    with pytest.raises(ValueError, match="crow_indices must have B \\+ 1 = 3"):
        SparseCounts(crow, col, val, (2, 4))
    with pytest.raises(ValueError, match="col_indices and values must have the same length"):
        SparseCounts(crow, col, val[:-1], (3, 4))
    with pytest.raises(ValueError, match="int32 or int64"):
        SparseCounts(crow.float(), col, val, (3, 4))
    with pytest.raises(ValueError, match=r"log_alpha must be shared, shape \(4,\)"):
        dirmult_ext.log_lik(SparseCounts(crow, col, val, (3, 4)), torch.zeros(5, device=device))
    with pytest.raises(ValueError, match="Per-sample"):
        dirmult_ext.log_lik(SparseCounts(crow, col, val, (3, 4)), torch.zeros(3, 4, device=device))
    with pytest.raises(ValueError, match=r"log_alpha must be \(K, 4\)"):
        dirmult_ext.log_lik_components(SparseCounts(crow, col, val, (3, 4)), la)
    with pytest.raises(ValueError, match="2-d"):
        dirmult_ext.log_lik(torch.zeros(2, 3, 4, device=device).to_sparse(), la)
    with pytest.raises(TypeError, match="log_alpha must be a torch.Tensor"):
        dirmult_ext.log_lik(SparseCounts(crow, col, val, (3, 4)), [0.0] * 4)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="same device"):
            dirmult_ext.log_lik(SparseCounts(crow, col, val, (3, 4)), la.cpu())


def test_unchecked_bad_indices_never_read_out_of_bounds(device):
    """Without validation, a row whose offsets or columns leave the matrix is
    NaN (the kernels do not read outside the parts); the others are right."""
    crow, col, val = (t.cpu() for t in _parts(device))
    la = torch.randn(4, device=device)
    good = ops.log_lik_csr(crow.to(device), col.to(device), val.to(device), la, False)
    bad_col = torch.tensor([1, 3, 0, 1000])
    out = ops.log_lik_csr(crow.to(device), bad_col.to(device), val.to(device), la, False)
    assert out[2].isnan() and torch.equal(out[:2], good[:2])
    bad_crow = torch.tensor([0, 2, 2, 1000])
    out = ops.log_lik_csr(bad_crow.to(device), col.to(device), val.to(device), la, False)
    assert out[2].isnan() and torch.equal(out[:2], good[:2])


# ---------------------------------------------------- PyTorch's machinery
def _op_args(device, K=None, index=torch.int64, compute=torch.float32):
    dense = random_sparse_counts(10, 14, 0.3).to(device)
    dense[4] = 0.0
    csr = dense.to_sparse_csr()
    # (Clones: views of a sparse tensor's parts trip torch's tracing, see
    # test_compile_fullgraph_dynamic_nonzeros.)
    crow, col = csr.crow_indices().to(index).clone(), csr.col_indices().to(index).clone()
    val = csr.values().to(compute).clone()
    shape = (14,) if K is None else (K, 14)
    la = torch.randn(shape, dtype=compute, device=device, requires_grad=True)
    return crow, col, val, la


@pytest.mark.parametrize("K", [None, 3])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_opcheck(device, K, index):
    crow, col, val, la = _op_args(device, K, index)
    torch.library.opcheck(ops.log_lik_csr.default, (crow, col, val, la, True))
    ptr, rows, cval = csc_parts(crow, col, val, 14)
    grad = torch.randn((10,) if K is None else (10, K), device=device)
    torch.library.opcheck(ops.log_lik_csr_backward.default,
                          (grad, crow, val, ptr, rows, cval, la.detach()))


def _csr_sum(crow, col, val, la):
    return ops.log_lik_csr(crow, col, val, la, True).sum()


def test_compile_fullgraph_dynamic_nonzeros(device):
    torch._dynamo.reset()
    # (Inductor's GPU code needs Triton; where it is missing, AOTAutograd
    # alone still traces the ops' fake kernels with a dynamic nnz.)
    from torch.utils._triton import has_triton
    backend = "inductor" if device.type == "cpu" or has_triton() else "aot_eager"
    compiled = torch.compile(_csr_sum, fullgraph=True, dynamic=True, backend=backend)
    for density in (0.2, 0.5, 0.05):
        dense = random_sparse_counts(9, 14, density).to(device)
        csr = dense.to_sparse_csr()
        # (Clones: views of a sparse tensor's parts break dynamo's
        # automatic-dynamic bookkeeping in torch 2.14, an IndexError on their
        # strides; export meets aten.as_strided on them.)
        parts = (csr.crow_indices().clone(), csr.col_indices().clone(), csr.values().clone())
        la = torch.randn(14, device=device, requires_grad=True)
        out = compiled(*parts, la)
        g, = torch.autograd.grad(out, la)
        la2 = la.detach().clone().requires_grad_()
        ref = _csr_sum(*parts, la2)
        g_ref, = torch.autograd.grad(ref, la2)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(g, g_ref)


@torch.jit.script
def scripted_csr_nll(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor,
                     log_alpha: torch.Tensor) -> torch.Tensor:
    return -torch.ops.dirmult.log_lik_csr(crow, col, values, log_alpha, False).mean()


def test_torchscript_of_csr_parts(device):
    crow, col, val, la = _op_args(device)
    la = la.detach()
    expected = -dirmult_ext.log_lik(SparseCounts(crow, col, val, (10, 14)), la).mean()
    torch.testing.assert_close(scripted_csr_nll(crow, col, val, la), expected)


# ------------------------------------------------------------------ fitting
def _sparse_mixture_data(B, V, K, seed):
    """Rows from K components, each with alpha 2 on its own block of V // K
    categories and 0.03 elsewhere (most counts zero); totals 20..39."""
    from dirmult_ext.likelihood.distribution import DirichletMultinomial
    torch.manual_seed(seed)
    alpha = torch.full((K, V), 0.03, dtype=torch.float64)
    for k in range(K):
        alpha[k, k * (V // K):(k + 1) * (V // K)] = 2.0
    z = torch.randint(0, K, (B,))
    x = DirichletMultinomial(torch.randint(20, 40, (B,)), alpha[z]).sample().float()
    return x, z, alpha


def test_fit_on_sparse_equals_dense(device):
    x, _, alpha = _sparse_mixture_data(3000, 40, 1, seed=11)
    assert (x == 0).double().mean() > 0.5
    dense = dirmult_ext.fit(x.to(device))
    for form in (x.to_sparse_csr(), SparseCounts.from_dense(x.to(device))):
        r = dirmult_ext.fit(form, device=device)
        assert r.converged
        torch.testing.assert_close(r.log_alpha, dense.log_alpha, rtol=0, atol=1e-7)
        assert abs(r.log_lik - dense.log_lik) <= 1e-9 * abs(dense.log_lik)
    assert ((dense.alpha - alpha[0]) / alpha[0]).abs().max() < 0.25  # the truth
    streamed = dirmult_ext.fit(scipy_sparse.csr_matrix(x.numpy()), batch_size=700, device=device)
    torch.testing.assert_close(streamed.log_alpha, dense.log_alpha, rtol=0, atol=1e-7)
    w = torch.rand(3000, dtype=torch.float64)
    torch.testing.assert_close(dirmult_ext.fit(x.to_sparse(), weights=w, device=device).log_alpha,
                               dirmult_ext.fit(x, weights=w, device=device).log_alpha,
                               rtol=0, atol=1e-7)


def test_mixture_and_classifier_on_sparse(device):
    from dirmult_ext.models.metrics import adjusted_rand_index
    K = 3
    x, z, _ = _sparse_mixture_data(900, 45, K, seed=5)
    sparse = x.to_sparse_csr()
    m = dirmult_ext.fit_mixture(sparse, K, seed=2, device=device, progress=False)
    m_dense = dirmult_ext.fit_mixture(x, K, seed=2, device=device, progress=False)
    assert m.converged
    assert abs(m.log_lik - m_dense.log_lik) <= 1e-8 * abs(m_dense.log_lik)
    assert adjusted_rand_index(m.predict(sparse).cpu(), z) > 0.9
    torch.testing.assert_close(m.joint_log_lik(sparse), m.joint_log_lik(x), rtol=1e-6, atol=1e-6)
    clf = dirmult_ext.DMClassifier(device=device).fit(scipy_sparse.csr_matrix(x.numpy()), z)
    clf_dense = dirmult_ext.DMClassifier(device=device).fit(x, z)
    torch.testing.assert_close(clf.log_alpha_, clf_dense.log_alpha_, rtol=0, atol=1e-7)
    assert clf.score(sparse, z) == clf_dense.score(x, z) and clf.score(sparse, z) > 0.9


def test_distribution_log_prob_of_sparse_counts(device):
    from dirmult_ext.likelihood.distribution import DirichletMultinomial
    d = DirichletMultinomial(torch.tensor(15.0), torch.rand(20, dtype=torch.float64) + 0.1,
                             validate_args=True)
    x = d.sample((60,))
    x = x.to(device)
    d = DirichletMultinomial(torch.tensor(15.0, dtype=torch.float64, device=device),
                             d.concentration.to(device), validate_args=True)
    torch.testing.assert_close(d.log_prob(x.to_sparse_csr()), d.log_prob(x))
    bad = x.clone()
    bad[0, 0] += 1
    with pytest.raises(ValueError, match="sum to total_count"):
        d.log_prob(bad.to_sparse_csr())
    batched = DirichletMultinomial(None, torch.rand(3, 20, device=device) + 0.1)
    with pytest.raises(ValueError, match="batch_shape"):
        batched.log_prob(x.to_sparse_csr())


def test_load_counts_sparse(tmp_path):
    import scipy.io
    from dirmult_ext.data.io import load_counts
    x = random_sparse_counts(30, 12, 0.2).round().numpy()
    scipy.io.mmwrite(str(tmp_path / "x.mtx"), scipy_sparse.coo_matrix(x))
    scipy_sparse.save_npz(tmp_path / "x.npz", scipy_sparse.csr_matrix(x))
    np.save(tmp_path / "x.npy", x)
    for name in ("x.mtx", "x.npz", "x.npy"):
        sc = load_counts(tmp_path / name, sparse=True)
        assert isinstance(sc, SparseCounts) and sc.shape == x.shape, name
        assert sc.values.dtype == torch.float32
        np.testing.assert_array_equal(sc.to_dense().numpy(), x, err_msg=name)
    assert load_counts(tmp_path / "x.mtx", sparse=True, dtype=torch.float64).values.dtype \
        == torch.float64
    # By default sparse files load sparse, dense ones dense.
    assert isinstance(load_counts(tmp_path / "x.mtx"), SparseCounts)
    assert isinstance(load_counts(tmp_path / "x.npz"), SparseCounts)
    assert isinstance(load_counts(tmp_path / "x.npy"), torch.Tensor)
    np.testing.assert_array_equal(load_counts(tmp_path / "x.mtx", sparse=False).numpy(), x)
    x[4, 5] = -2.0
    scipy_sparse.save_npz(tmp_path / "bad.npz", scipy_sparse.csr_matrix(x))
    with pytest.raises(ValueError, match="negative count -2.0 at row 5, column 6"):
        load_counts(tmp_path / "bad.npz", sparse=True)
    x[4, 5] = 2.5
    scipy_sparse.save_npz(tmp_path / "frac.npz", scipy_sparse.csr_matrix(x))
    with pytest.raises(ValueError, match="non-integer count 2.5"):
        load_counts(tmp_path / "frac.npz", sparse=True, require_integer=True)


def test_export_with_dynamic_nonzeros(device):
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.log_alpha = torch.nn.Parameter(torch.randn(14))

        def forward(self, crow, col, values):
            return ops.log_lik_csr(crow, col, values, self.log_alpha, False)

    model = Model().to(device)
    crow, col, val, _ = _op_args(device)
    # (rows >= 3: the output has rows - 1 entries, and sizes 0 and 1 are
    # specialized.)
    nnz, rows = torch.export.Dim("nnz"), torch.export.Dim("rows", min=3)
    ep = torch.export.export(model, (crow, col, val),
                             dynamic_shapes={"crow": {0: rows}, "col": {0: nnz},
                                             "values": {0: nnz}})
    csr = random_sparse_counts(17, 14, 0.6).to(device).to_sparse_csr()
    parts = (csr.crow_indices().clone(), csr.col_indices().clone(), csr.values().clone())
    torch.testing.assert_close(ep.module()(*parts), model(*parts))


# -------------------------------------------------------------- distributed
def _sparse_shard_worker(rank, world, init_file, data_file, out_dir):
    import os

    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    from dirmult_ext.models.distributed import fit_distributed
    try:
        x = torch.load(data_file)["x"]
        sc = SparseCounts.from_dense(x)
        sl = slice(0, 101) if rank == 0 else slice(101, None)  # uneven shards
        r = fit_distributed(sc[sl])
        torch.save((r.log_alpha, r.log_lik, r.n_iter, r.n_rows),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_distributed_fit_on_sparse_shards(tmp_path):
    import math

    import torch.multiprocessing as mp
    x, _, _ = _sparse_mixture_data(300, 24, 1, seed=3)
    torch.save({"x": x}, tmp_path / "data.pt")
    mp.spawn(_sparse_shard_worker,
             args=(2, str(tmp_path / "init"), str(tmp_path / "data.pt"), str(tmp_path)),
             nprocs=2, join=True)
    ref = dirmult_ext.fit(x)
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for la, ll, n_iter, n_rows in res:
        assert n_rows == 300 and n_iter == ref.n_iter
        assert math.isclose(ll, ref.log_lik, rel_tol=1e-11)
        torch.testing.assert_close(la, ref.log_alpha, rtol=0, atol=1e-8)
    assert torch.equal(res[0][0], res[1][0])


@pytest.mark.slow  # (processes of their own: runs in CI, `-m slow`)
def test_torchrun_launcher_on_mtx(tmp_path):
    import math
    import os
    import socket
    import subprocess
    import sys

    import scipy.io
    x, _, _ = _sparse_mixture_data(200, 16, 1, seed=9)
    f = str(tmp_path / "counts.mtx")
    scipy.io.mmwrite(f, scipy_sparse.coo_matrix(x.numpy()))
    out = str(tmp_path / "params.npz")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parent = os.path.dirname(os.path.dirname(os.path.abspath(dirmult_ext.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=parent + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={port}",
           "-m", "dirmult_ext.cli.distributed", f, "--device", "cpu", "--out", out]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    got = np.load(out)
    ref = dirmult_ext.fit(x)
    np.testing.assert_allclose(got["log_alpha"], ref.log_alpha.numpy(), rtol=0, atol=1e-8)
    assert math.isclose(float(got["log_lik"]), ref.log_lik, rel_tol=1e-11)


def test_row_selection_and_slices(device):
    dense = random_sparse_counts(25, 11, 0.3).to(device)
    dense[4] = 0.0
    sc = SparseCounts.from_dense(dense)
    idx = torch.tensor([7, 4, 0, 24, 7, -1])
    assert torch.equal(sc[idx].to_dense(), dense[idx.to(device)])
    assert torch.equal(sc[3:9].to_dense(), dense[3:9])
    assert sc[0:25] is sc and sc[5:5].shape == (0, 11)
    with pytest.raises(IndexError, match="out of range"):
        sc[torch.tensor([25])]


def test_cli_fit_on_mtx_with_labels(tmp_path):
    import subprocess
    import sys

    import scipy.io
    x, z, _ = _sparse_mixture_data(450, 30, 3, seed=8)
    scipy.io.mmwrite(str(tmp_path / "c.mtx"), scipy_sparse.coo_matrix(x.numpy()))
    np.savetxt(tmp_path / "l.txt", z.numpy(), fmt="%d")
    np.save(tmp_path / "c.npy", x.numpy())
    outs = []
    for name in ("c.mtx", "c.npy"):
        p = subprocess.run([sys.executable, "-m", "dirmult_ext", "fit", str(tmp_path / name),
                            "--k", "3", "--labels", str(tmp_path / "l.txt"), "--device", "cpu",
                            "--out", str(tmp_path / f"{name}.npz")],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        outs.append(np.load(tmp_path / f"{name}.npz"))
        assert "rows x 30 categories" in p.stdout and "accuracy" in p.stdout
    sparse_out, dense_out = outs
    assert abs(float(sparse_out["log_lik"]) - float(dense_out["log_lik"])) \
        <= 1e-8 * abs(float(dense_out["log_lik"]))
    assert float(sparse_out["classifier_accuracy"]) == float(dense_out["classifier_accuracy"])
    assert float(sparse_out["naive_bayes_accuracy"]) == float(dense_out["naive_bayes_accuracy"])


def test_torch_sparse_conversion_kept_while_unchanged(device):
    dense = random_sparse_counts(20, 9, 0.3).to(device)
    csr = dense.to_sparse_csr()
    from dirmult_ext.data.sparse_counts import as_sparse_counts
    sc = as_sparse_counts(csr)
    assert as_sparse_counts(csr) is sc
    la = torch.randn(9, device=device)
    before = dirmult_ext.log_lik(csr, la)
    csr.values().mul_(2.0)  # changed in place: converted again
    assert as_sparse_counts(csr) is not sc
    torch.testing.assert_close(dirmult_ext.log_lik(csr, la), dirmult_ext.log_lik(2 * dense, la))
    assert not torch.equal(before, dirmult_ext.log_lik(csr, la))


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="CUDA synchronization")
def test_prepared_counts_do_not_synchronize_on_cuda():
    dense = random_sparse_counts(300, 2000, 0.02).cuda()
    sc = SparseCounts.from_dense(dense)
    sc.csc()
    la = torch.randn(2000, device="cuda", requires_grad=True)
    la_k = torch.randn(4, 2000, device="cuda", requires_grad=True)
    w = torch.rand(300, device="cuda")
    torch.autograd.grad((dirmult_ext.log_lik(sc, la) * w).sum(), la)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.autograd.grad((dirmult_ext.log_lik(sc, la) * w).sum(), la)
        torch.autograd.grad(dirmult_ext.log_lik(sc, la, reduction="mean"), la)
        torch.autograd.grad(dirmult_ext.log_lik_components(sc, la_k).sum(), la_k)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="CUDA against CPU")
@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_cuda_matches_cpu_kernels(compute):
    dense = random_sparse_counts(500, 700, 0.05).to(compute)
    dense[:, 9] = torch.randint(0, 40, (500,)).to(compute)  # a long column
    dense[7] = torch.randint(0, 5, (700,)).to(compute)       # a long row
    dense[8] = 0.0
    la = torch.randn(3, 700, dtype=compute)
    w = torch.randn(500, 3, dtype=compute)
    cpu_out = dirmult_ext.log_lik_components(dense.to_sparse_csr(), la, normalize=True)
    cpu_g = _weighted_grad(dense.to_sparse_csr(), la, w)
    cuda_out = dirmult_ext.log_lik_components(dense.cuda().to_sparse_csr(), la.cuda(),
                                              normalize=True)
    cuda_g = _weighted_grad(dense.cuda().to_sparse_csr(), la.cuda(), w.cuda())
    scale = component_magnitudes(dense, la, True).clamp_min(1.0)
    assert ((cuda_out.cpu() - cpu_out).abs().double() / scale).max() < 2 * TOL[compute]
    # Each gradient element relative to its terms' magnitudes (times the
    # largest row weight), as test_gradient_matches_float64_reference_autograd.
    for k in range(3):
        cols = magnitudes(dense, la[k])[1] * w[:, k].abs().max().double()
        err = (cuda_g[k].cpu() - cpu_g[k]).abs().double() / cols.clamp_min(1e-3)
        assert err.max() < 20 * TOL[compute]


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="the CUDA forward's ways")
@pytest.mark.parametrize("compute", [torch.float32, torch.float64])
def test_cuda_forward_table_and_math_ways_agree(compute):
    # The table holds 16 V K entries and, with as few nonzeros as these,
    # serves up to 32 MiB (policy.h): at V = 50000 up to 10 float32 or 5
    # float64 components; one more takes the per-nonzero math. 2 components and the largest table take the table
    # (one walk of up to 8 components, or two). Short rows and long rows
    # (the second matrix: a warp a row either way at these few rows).
    V = 50_000
    elem = torch.tensor([], dtype=compute).element_size()
    k_table = (32 << 20) // (16 * V * elem)
    la = torch.randn(k_table + 1, V, dtype=compute) - 1.0
    for B, density in ((70, 0.002), (3, 0.1)):
        dense = random_sparse_counts(B, V, density).to(compute)
        dense[1] = 0.0
        ref = components_float64(dense, la, True)
        scale = component_magnitudes(dense, la, True).clamp_min(1.0)
        sc = SparseCounts.from_dense(dense.cuda())
        outs = {K: dirmult_ext.log_lik_components(sc, la[:K].cuda(), normalize=True).cpu()
                for K in (2, k_table, k_table + 1)}
        for K, out in outs.items():
            assert ((out.double() - ref[:, :K]).abs() / scale[:, :K]).max() < TOL[compute]
        one = dirmult_ext.log_lik(sc, la[0].cuda(), normalize=True).cpu()
        assert torch.equal(one, outs[2][:, 0]) and torch.equal(one, outs[k_table][:, 0])
        assert torch.equal(outs[2], outs[k_table][:, :2])
        math_way = outs[k_table + 1][:, :k_table]
        assert ((math_way - outs[k_table]).abs().double() / scale[:, :k_table]).max() \
            < 2 * TOL[compute]


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="the CUDA forward's table sizes")
def test_cuda_large_table_and_padded_walks_agree():
    # Past 32 MiB the table still serves where the nonzeros' terms outnumber
    # its entries 4 to 1 (policy.h): V = 50000, K = 16 in float32 is 51 MB,
    # taken with these 4e6 nonzeros. Entries padded to 16-byte loads (K = 3,
    # 9, 10) and walks of 16 (K > 8, a warp a row): each component's sums
    # keep their order, so the same bits for any K.
    B, V = 400, 50_000
    dense = random_sparse_counts(B, V, 0.2)
    dense[3] = 0.0
    assert dense.count_nonzero() > 3_500_000
    la = torch.randn(16, V) - 1.0
    sc = SparseCounts.from_dense(dense.cuda())
    outs = {K: dirmult_ext.log_lik_components(sc, la[:K].cuda(), normalize=True).cpu()
            for K in (3, 9, 10, 16)}
    for K, out in outs.items():
        assert torch.equal(out, outs[16][:, :K]), K
    one = dirmult_ext.log_lik(sc, la[5].cuda(), normalize=True).cpu()
    assert torch.equal(one, outs[16][:, 5])
    rows = 40
    cpu = dirmult_ext.log_lik_components(SparseCounts.from_dense(dense[:rows]), la,
                                         normalize=True)
    scale = component_magnitudes(dense[:rows], la, True).clamp_min(1.0)
    assert ((outs[16][:rows] - cpu).abs().double() / scale).max() < 2 * TOL[torch.float32]
    assert torch.isfinite(outs[16][torch.arange(B) != 3]).all()


@pytest.mark.skipif(not (torch.cuda.is_available() and dirmult_ext.CUDA_KERNELS),
                    reason="the CUDA forward's row ways")
def test_cuda_rows_32_to_a_warp_match_a_warp_a_row():
    # 140000 short rows go 32 to a warp (each finished by its own lane); a
    # slice of 40 of them runs a warp a row: the same sums in the same order.
    B, V = 140_000, 64
    dense = random_sparse_counts(B, V, 0.05)
    dense[5] = 0.0
    la = torch.randn(3, V) - 0.5
    sc = SparseCounts.from_dense(dense.cuda())
    whole = dirmult_ext.log_lik_components(sc, la.cuda(), normalize=True).cpu()
    part = dirmult_ext.log_lik_components(sc[1000:1040], la.cuda(), normalize=True).cpu()
    assert torch.equal(whole[1000:1040], part)
    cpu = dirmult_ext.log_lik_components(SparseCounts.from_dense(dense), la, normalize=True)
    scale = component_magnitudes(dense[:2000], la, True).clamp_min(1.0)
    assert ((whole[:2000] - cpu[:2000]).abs().double() / scale).max() < 2 * TOL[torch.float32]
    single = dirmult_ext.log_lik(sc, la[1].cuda(), normalize=True).cpu()
    assert torch.equal(single, whole[:, 1])


def test_column_sorted_copy_built_once_per_matrix(device, monkeypatch):
    import dirmult_ext.data.sparse_counts as sparse_module
    calls = []
    build = sparse_module.csc_parts
    monkeypatch.setattr(sparse_module, "csc_parts", lambda *a: calls.append(1) or build(*a))
    dense = random_sparse_counts(40, 30, 0.2).to(device)
    la = torch.randn(30, device=device, requires_grad=True)
    for counts in (dense.to_sparse_csr(), SparseCounts.from_dense(dense)):
        calls.clear()
        grads = [torch.autograd.grad(dirmult_ext.log_lik(counts, la).sum(), la)[0]
                 for _ in range(3)]
        assert len(calls) == 1
        assert torch.equal(grads[0], grads[2])
    with torch.no_grad():  # no gradient wanted: no copy
        calls.clear()
        dirmult_ext.log_lik(dense.to_sparse_csr(), la)
        assert not calls


def test_module_takes_sparse_counts(device):
    dense = random_sparse_counts(16, 10, 0.3).to(device)
    model = dirmult_ext.DirichletMultinomialLogLik(10, torch.randn(10), reduction="sum").to(device)
    out = model(dense.to_sparse_csr())
    g, = torch.autograd.grad(out, model.log_alpha)
    ref = model(dense)
    g_ref, = torch.autograd.grad(ref, model.log_alpha)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-4)
    torch.jit.script(model)  # (still scriptable: the sparse path is eager-only)


def test_row_blocks_and_blocked_host_sums(monkeypatch):
    from dirmult_ext.data import sparse_counts as sparse
    from dirmult_ext.models.criteria import multinomial_log_lik
    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = torch.poisson(torch.rand(157, 23, generator=g) * 4, generator=g)
    x = x * (torch.rand(157, 23, generator=g) < 0.3)
    x[[10, 11, 80]] = 0
    x[0, 0] += 1
    sc = SparseCounts.from_dense(x)
    from dirmult_ext.likelihood.sparse_stats import row_sq_norms
    whole_ll, whole_N = multinomial_log_lik(sc), sc.row_totals()
    whole_x = sc.proportions(whole_N)
    whole_x2 = row_sq_norms(whole_x)
    monkeypatch.setattr(sparse, "ROW_BLOCK_NNZ", 17)
    blocks = sc.row_blocks()
    assert blocks[0][0] == 0 and blocks[-1][1] == 157 and len(blocks) > 10
    crow = sc.crow_indices
    for (s, e), nxt in zip(blocks, blocks[1:] + [(157, None)]):
        assert nxt[0] == e and e > s
        assert int(crow[e] - crow[s]) <= 17 or e - s == 1
    assert torch.equal(sc.row_totals(), whole_N)
    assert torch.equal(whole_N, x.double().sum(-1))
    props = sc.proportions(whole_N)
    assert torch.equal(props.values(), whole_x.values())
    assert torch.equal(row_sq_norms(props), whole_x2)
    dense_x = x.double() / whole_N.clamp_min(1e-300).unsqueeze(-1)
    assert torch.equal(props.to_dense(), dense_x)
    torch.testing.assert_close(whole_x2, (dense_x * dense_x).sum(-1), rtol=1e-15, atol=0)
    assert multinomial_log_lik(sc) == whole_ll     # (whole counts: exact sums)
    assert math.isclose(multinomial_log_lik(x), whole_ll, rel_tol=1e-12)


def test_value_rows_equals_the_search_for_any_offsets():
    from dirmult_ext.data.sparse_counts import value_rows
    from dirmult_ext.ops.csr import row_of_nonzero
    k = torch.randint(0, 4, (300,))
    k[:3] = 0                                       # empty rows first, and elsewhere
    crow = torch.zeros(301, dtype=torch.int64)
    crow[1:] = k.cumsum(0)
    nnz = int(crow[-1])
    for c in (crow, crow.int()):
        rows = value_rows(c, nnz)
        assert rows.dtype == torch.int64
        assert torch.equal(rows, row_of_nonzero(c, nnz).long())
        assert torch.equal(rows, torch.repeat_interleave(torch.arange(300), k))
        narrow = value_rows(c, nnz, torch.int32)
        assert narrow.dtype == torch.int32 and torch.equal(narrow.long(), rows)
    bad = crow.clone()
    bad[100] = bad[101] + 2                          # decreasing offsets (unchecked input)
    assert torch.equal(value_rows(bad, nnz), row_of_nonzero(bad, nnz))
    assert torch.equal(value_rows(bad, nnz, torch.int32).long(), row_of_nonzero(bad, nnz))
    assert torch.equal(value_rows(crow, nnz - 1), row_of_nonzero(crow, nnz - 1))
