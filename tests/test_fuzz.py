"""Random calls of the public API and the raw ops: shapes, dtypes, layouts
(transposed, offset, strided), normalize, shared and per-sample
concentrations, components, bad values and bad arguments. Each call either
matches the float64 lgamma reference within the documented bound (NaN rows
where a count is negative or not finite), or raises ValueError, TypeError or
RuntimeError naming the argument; never a crash or a finite wrong number.

The seed is fresh per run and printed on failure; DIRMULT_FUZZ_SEED=<seed>
replays a run.
"""
import math
import os
import random

import pytest
import torch

import dirmult_ext
from reference import component_magnitudes, components_float64, log_lik_float64, magnitudes

SEED = int(os.environ.get("DIRMULT_FUZZ_SEED") or random.SystemRandom().randrange(2 ** 32))
CASES_PER_DEVICE = 300
COUNT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                torch.int32, torch.int64, torch.uint8]
# The documented bound: the error relative to the size of the row's terms
# (tests/reference.py, magnitudes), by compute dtype.
BOUND = {torch.float32: 2e-6, torch.float64: 1e-12}


def _layout(r, values):
    """values (a tensor) in one of four memory layouts, the same elements."""
    how = r.choice(["contiguous", "transposed", "offset", "strided"])
    if how == "transposed" and values.dim() >= 2:
        return values.transpose(0, 1).contiguous().transpose(0, 1), how
    if how == "offset":
        flat = torch.empty(values.numel() + 3, dtype=values.dtype, device=values.device)
        view = flat[3:].view(values.shape)
        view.copy_(values)
        return view, how
    if how == "strided" and values.dim() >= 1:
        wide = torch.zeros(*values.shape[:-1], 2 * values.shape[-1], dtype=values.dtype,
                           device=values.device)
        view = wide[..., ::2]
        view.copy_(values)
        return view, how
    return values.clone(), "contiguous"


def _counts(r, g, shape, dtype, device):
    high = r.choice([1, 3, 10, 40])
    counts = torch.randint(0, high + 1, shape, generator=g) * (torch.rand(shape, generator=g) > 0.4)
    counts = counts.to(torch.float64)
    if dtype in (torch.float32, torch.float64) and r.random() < 0.2:
        counts = counts + torch.rand(shape, generator=g, dtype=torch.float64)  # Gamma extension
    return _layout(r, counts.to(dtype).to(device))


def _log_alpha(r, g, shape, dtype, device):
    return _layout(r, torch.empty(shape, dtype=torch.float64).uniform_(-3, 4, generator=g)
                   .to(dtype).to(device))


def _check_values(out, ref, scale, bad_rows, what):
    assert out.shape == ref.shape, (what, tuple(out.shape), tuple(ref.shape))
    out = out.detach().double().cpu()
    bad = torch.zeros(ref.shape, dtype=torch.bool)
    if bad_rows is not None:
        bad = bad_rows.reshape(bad_rows.shape + (1,) * (ref.dim() - bad_rows.dim())).expand(ref.shape)
    assert torch.isnan(out[bad]).all(), (what, "a bad row is not NaN", out[bad])
    good = ~bad
    assert torch.isfinite(out[good]).all(), (what, "a good row is not finite")
    if good.any():
        err = ((out[good] - ref[good]).abs() / scale[good].clamp_min(1.0)).max().item()
        assert err < BOUND[what["dtype"]], (what, "error", err)


def _expect_error(f, names, what):
    try:
        f()
    except (ValueError, TypeError, RuntimeError) as e:
        text = str(e)
        assert any(name in text for name in names), (what, "message names none of", names, text)
        return
    raise AssertionError((what, "no error"))


def _valid_case(r, g, device, what):
    components = r.random() < 0.3
    V = r.choice([1, 2, 3, 5, 8, 17, 64])
    dtype = r.choice(COUNT_DTYPES)
    la_dtype = r.choice([torch.float32, torch.float64])
    normalize = r.random() < 0.5
    if components:
        batch = (r.choice([0, 1, 3, 9, 70]),)
    else:
        batch = r.choice([(), (0,), (1,), (4,), (2, 3), (70,)])
    counts, counts_layout = _counts(r, g, batch + (V,), dtype, device)
    shared = components or r.random() < 0.6 or not batch
    if components:
        la_shape = (r.choice([1, 2, 5]), V)
    else:
        la_shape = (V,) if shared else batch + (V,)
    log_alpha, la_layout = _log_alpha(r, g, la_shape, la_dtype, device)
    bad_rows = None
    if counts.numel() and counts.dim() >= 2 and r.random() < 0.3:
        choices = [-1.0] if dtype in (torch.int32, torch.int64) else (
            [] if dtype == torch.uint8 else [-1.0, math.nan, math.inf, -math.inf])
        if choices:
            index = tuple(r.randrange(s) for s in counts.shape)
            counts[index] = r.choice(choices)
            bad_rows = torch.zeros(counts.shape[:-1], dtype=torch.bool)
            bad_rows[index[:-1]] = True
    raw = r.random() < 0.4
    compute = torch.float64 if (dtype == torch.float64 or la_dtype == torch.float64) else torch.float32
    if raw:
        compute = la_dtype
    what.update(op="components" if components else "log_lik", raw=raw, batch=batch, V=V,
                counts=(dtype, counts_layout), log_alpha=(la_shape, la_dtype, la_layout),
                normalize=normalize, bad_rows=bad_rows is not None, dtype=compute)
    if components:
        out = (torch.ops.dirmult.log_lik_components(counts, log_alpha, normalize) if raw
               else dirmult_ext.log_lik_components(counts, log_alpha, normalize=normalize))
        ref = components_float64(counts.cpu(), log_alpha.to(compute).cpu(), normalize)
        scale = (component_magnitudes(counts.cpu(), log_alpha.to(compute).cpu(), normalize)
                 if batch[0] else ref)
    else:
        out = (torch.ops.dirmult.log_lik(counts, log_alpha, normalize) if raw
               else dirmult_ext.log_lik(counts, log_alpha, normalize=normalize))
        ref = log_lik_float64(counts.cpu(), log_alpha.to(compute).cpu(), normalize)
        scale = (magnitudes(counts.cpu(), log_alpha.to(compute).cpu(), normalize)[0]
                 if counts.numel() else ref)
        if V == 0:
            ref = torch.zeros(batch, dtype=torch.float64)
    assert out.dtype == compute and out.device == counts.device, (what, out.dtype, out.device)
    _check_values(out, ref, scale.reshape(ref.shape), bad_rows, what)


def _bad_case(r, g, device, what):
    V = r.choice([2, 5, 9])
    B = r.choice([1, 4, 70])
    counts, _ = _counts(r, g, (B, V), torch.float32, device)
    la, _ = _log_alpha(r, g, (V,), torch.float32, device)
    comp, _ = _log_alpha(r, g, (3, V), torch.float32, device)
    ops, api = torch.ops.dirmult, dirmult_ext
    cases = {
        "wrong V": [(lambda: api.log_lik(counts, la[:-1]), ["log_alpha"]),
                    (lambda: ops.log_lik(counts, la[:-1], False), ["log_alpha"]),
                    (lambda: ops.log_lik_with_grad(counts, la[:-1], False), ["log_alpha"]),
                    (lambda: api.log_lik_components(counts, comp[:, :-1]), ["log_alpha"]),
                    (lambda: ops.log_lik_components(counts, comp[:, :-1], False), ["log_alpha"])],
        "wrong per-sample shape": [(lambda: api.log_lik(counts, la.expand(B + 1, V)), ["log_alpha"]),
                                   (lambda: ops.log_lik(counts, la.expand(B + 1, V), False),
                                    ["log_alpha"])],
        "wrong K": [(lambda: ops.log_lik_components_backward(
            torch.ones(B, 4, device=device), counts, comp), ["grad"])],
        "wrong grad": [(lambda: ops.log_lik_backward(torch.ones(B + 1, device=device), counts, la,
                                                     False, False), ["grad"]),
                       (lambda: ops.log_lik_backward(torch.ones(B, dtype=torch.float64, device=device),
                                                     counts, la, False, False), ["grad"])],
        "complex counts": [(lambda: api.log_lik(counts.to(torch.complex64), la), ["counts"]),
                           (lambda: ops.log_lik(counts.to(torch.complex64), la, False), ["counts"])],
        "bool counts": [(lambda: api.log_lik(counts > 0, la), ["counts"]),
                        (lambda: ops.log_lik_components(counts > 0, comp, False), ["counts"])],
        "integer log_alpha": [(lambda: api.log_lik(counts, la.long()), ["log_alpha"]),
                              (lambda: ops.log_lik(counts, la.long(), False), ["log_alpha"])],
        "complex log_alpha": [(lambda: ops.log_lik(counts, la.to(torch.complex64), False),
                               ["log_alpha"])],
        "0-d counts": [(lambda: api.log_lik(counts[0, 0], la[:1]), ["counts"]),
                       (lambda: ops.log_lik(counts[0, 0], la[:1], False), ["counts"])],
        "not a tensor": [(lambda: api.log_lik(counts.tolist(), la), ["counts"]),
                         (lambda: api.log_lik(counts, alpha=la.tolist()), ["alpha"])],
        "poch_terms sizes": [(lambda: ops.poch_terms(la, la[:-1]), ["log_alpha", "n"])],
        "sparse counts": [(lambda: api.log_lik(counts.to_sparse(), la[:-1]), ["log_alpha"]),
                          (lambda: api.log_lik(counts.to_sparse(),
                                               la.expand(counts.shape).contiguous()),
                           ["log_alpha"]),
                          # (natively the dispatcher's error: no sparse kernel)
                          (lambda: ops.log_lik(counts.to_sparse(), la, False),
                           ["counts", "'SparseCPU' backend", "'SparseCUDA' backend"])],
    }
    if device.type == "cuda":
        cases["wrong device"] = [(lambda: api.log_lik(counts, la.cpu()), ["device"]),
                                 (lambda: ops.log_lik(counts, la.cpu(), False), ["device"]),
                                 (lambda: ops.log_lik_components(counts.cpu(), comp, False),
                                  ["device"]),
                                 (lambda: ops.poch_terms(la, la.cpu()), ["device"])]
    kind = r.choice(sorted(cases))
    f, names = r.choice(cases[kind])
    what.update(bad=kind)
    _expect_error(f, names, what)


def test_fuzz(device):
    rng = random.Random(f"{SEED}-{device.type}")
    for i in range(CASES_PER_DEVICE):
        case_seed = rng.randrange(2 ** 31)
        r, g = random.Random(case_seed), torch.Generator().manual_seed(case_seed)
        what = {}
        try:
            (_bad_case if r.random() < 0.3 else _valid_case)(r, g, device, what)
        except Exception as e:
            raise AssertionError(f"fuzz case {i} on {device} failed (replay with "
                                 f"DIRMULT_FUZZ_SEED={SEED}): {what}: {e!r}") from e
