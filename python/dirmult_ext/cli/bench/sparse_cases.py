"""``--sparse``: CSR counts (``SparseCounts``) timed against the CSR floor,
the hand-written PyTorch over the nonzeros, and the dense op on the
densified matrix where it fits; errors against float64 on the first rows."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from ...data.sparse_counts import SparseCounts
from ...likelihood.log_lik import log_lik, log_lik_components, reference_log_lik
from . import peers
from .cases import F32, l2_bytes, make_log_alpha
from .measure import err_text, free, median, rel_err
from .timing import Timer

I32 = 4  # bytes per int32 index
DENSE_MAX_BYTES = 8 << 30  # the dense op runs on the densified matrix only up to this size
CHECK_ROWS = 256  # rows checked against float64


@dataclass
class SparseShape:
    name: str
    B: int
    V: int
    density: float
    components: int = 0  # K > 0: also time log_lik_components with K components here

    @property
    def bxv(self) -> str:
        return f"{self.B}x{self.V}:{self.density:g}"


SPARSE_SHAPES = {
    "cuda": [SparseShape("csr_square", 16384, 16384, 0.01),
             SparseShape("csr_tall", 200000, 30000, 0.03, components=16),
             SparseShape("csr_huge", 1000000, 50000, 0.002)],
    "cpu": [SparseShape("csr_square", 4096, 4096, 0.01),
            SparseShape("csr_tall", 8192, 2048, 0.03, components=16)],
    "quick": [SparseShape("csr_square", 256, 512, 0.02),
              SparseShape("csr_tall", 512, 256, 0.05, components=4)],
}


def make_csr(shape: SparseShape, g: torch.Generator, device: torch.device) -> SparseCounts:
    """Random CSR counts built directly (never dense): each row's number of
    nonzeros ~ Poisson(V * density) (at most V, at least 1 in row 0), its
    columns a uniform subset (k sorted draws from [0, V - k] plus their rank
    are distinct and increasing), values 1 + Poisson(3); int32 indices."""
    B, V = shape.B, shape.V
    k = torch.poisson(torch.full((B,), V * shape.density, device=device), generator=g)
    k = k.clamp_(0, V).long()
    k[0] = k[0].clamp(min=1)
    crow = torch.zeros(B + 1, dtype=torch.int64, device=device)
    torch.cumsum(k, 0, out=crow[1:])
    nnz = int(crow[-1])
    if nnz >= 2**31:
        raise ValueError(f"{nnz} nonzeros do not fit int32 indices")
    rows = torch.repeat_interleave(torch.arange(B, device=device), k, output_size=nnz)
    span = (V - k + 1)[rows]  # draws in [0, V - k_row]
    r = (torch.rand(nnz, generator=g, device=device, dtype=torch.float64) * span).long()
    r = torch.minimum(r, span - 1)
    keys = torch.sort(rows * V + r).values  # sorts the draws within each row
    del r, span
    col = keys - rows * V + (torch.arange(nnz, device=device) - crow[rows])
    del keys
    values = 1.0 + torch.poisson(torch.full((nnz,), 3.0, device=device), generator=g)
    return SparseCounts(crow.int(), col.int(), values, (B, V), validate=False)


def _copies(sc: SparseCounts, device: torch.device) -> List[SparseCounts]:
    """``sc`` and enough copies that together they do not fit in L2 (see
    cases.rotation_copies), each with its column-sorted copy built."""
    nbytes = sc.nnz * (F32 + I32) + sc.crow_indices.numel() * I32
    cache = l2_bytes(device)
    n = 1 if cache <= 0 else min(64, -(-3 * cache // nbytes))
    out = [sc] + [SparseCounts(sc.crow_indices.clone(), sc.col_indices.clone(),
                               sc.values.clone(), sc.shape, validate=False) for _ in range(n - 1)]
    for c in out:
        c.csc()
    return out


def handwritten(val, col, row, N, B, log_alpha):
    """The PyTorch a user writes over the nonzeros (row: int64 row of each)."""
    a = log_alpha.exp()
    ac = a[col]
    t = torch.lgamma(val + ac) - torch.lgamma(ac)
    A = a.sum()
    return torch.zeros(B, dtype=t.dtype, device=t.device).index_add_(0, row, t) \
        + torch.lgamma(A) - torch.lgamma(N + A)


def _grad(f: Callable[[torch.Tensor], torch.Tensor], la_g: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(f(la_g).sum(), la_g)[0]


def _errors(sc: SparseCounts, la: torch.Tensor, parts, comp_la) -> dict:
    """This package's forward (full call, first rows), the gradient of the
    first rows' sum, the hand-written forward, and the components, each
    against float64 on the first CHECK_ROWS rows."""
    b = min(CHECK_ROWS, sc.shape[0])
    sub = sc[0:b]
    dense64 = sub.to_dense().double()
    la64 = la.double().requires_grad_(True)
    ref = reference_log_lik(dense64, la64)
    gref = torch.autograd.grad(ref.sum(), la64)[0]
    ref = ref.detach()
    out = {}
    with torch.no_grad():
        out["err_fwd"] = rel_err(log_lik(sc, la)[:b], ref)
        val, col, row, N = parts
        out["err_handwritten_fwd"] = rel_err(handwritten(val, col, row, N, sc.shape[0], la)[:b],
                                             ref)
    out["err_grad"] = rel_err(_grad(lambda a: log_lik(sub, a), la.detach().clone()
                                    .requires_grad_(True)), gref)
    if comp_la is not None:
        with torch.no_grad():
            cref = torch.stack([reference_log_lik(dense64, comp_la[k].double())
                                for k in range(comp_la.shape[0])], dim=1)
            out["err_components_fwd"] = rel_err(log_lik_components(sub, comp_la), cref)
    return out


def _time(timer: Timer, row: dict, key: str, fn: Callable[[], object],
          log: Callable[[str], None]) -> None:
    """One column; a failure (out of memory, no graph capture) is n/a."""
    try:
        row["times"][key] = timer(fn)
    except Exception as e:  # noqa: BLE001 - a column's failure is n/a, not the run's
        row["times"][key] = None
        row["errors"][key] = err_text(e)
        log(f"  {row['name']}: {key} failed: {err_text(e)}")
    free(timer.device)


def bench_sparse_shape(shape: SparseShape, g: torch.Generator, device: torch.device,
                       timer: Timer, bw: float, log: Callable[[str], None]) -> dict:
    B, V = shape.B, shape.V
    sc = make_csr(shape, g, device)
    la = make_log_alpha((V,), g, device)
    la_g = la.detach().clone().requires_grad_(True)
    nnz = sc.nnz
    fwd_bytes = nnz * (F32 + I32) + (B + 1) * I32 + V * F32 + B * F32
    # the backward reads the column-sorted copy (row index + value per nonzero,
    # column offsets) and the incoming gradient, and writes the gradient
    fb_bytes = fwd_bytes + nnz * (F32 + I32) + (V + 1) * I32 + B * F32 + V * F32
    row = {"name": shape.name, "B": B, "V": V, "density": shape.density, "nnz": nnz,
           "nonzero_fraction": nnz / (B * V),
           "floor_bytes": fwd_bytes, "floor_us": fwd_bytes / bw * 1e6,
           "floor_fwdbwd_bytes": fb_bytes, "floor_fwdbwd_us": fb_bytes / bw * 1e6,
           "times": {}, "errors": {}, "components": None, "dense": None}
    t = row["times"]

    sc.csc()
    rows64 = torch.repeat_interleave(torch.arange(B, device=device),
                                     sc.crow_indices.diff().long(), output_size=nnz)
    N = torch.zeros(B, device=device).index_add_(0, rows64, sc.values)
    parts = (sc.values, sc.col_indices, rows64, N)
    comp_la = make_log_alpha((shape.components, V), g, device) if shape.components else None
    row.update(_errors(sc, la, parts, comp_la))
    free(device)

    copies = _copies(sc, device)
    nxt = itertools.cycle(copies).__next__
    log(f"  sparse {shape.name}: ext ({len(copies)} copies)")
    _time(timer, row, "ext_fwd", lambda: log_lik(nxt(), la), log)
    _time(timer, row, "ext_fwdbwd", lambda: _grad(lambda a: log_lik(nxt(), a), la_g), log)
    del copies, nxt

    log(f"  sparse {shape.name}: hand-written PyTorch")
    _time(timer, row, "handwritten_fwd", lambda: handwritten(*parts, B, la), log)
    _time(timer, row, "handwritten_fwdbwd",
          lambda: _grad(lambda a: handwritten(*parts, B, a), la_g), log)
    del parts, rows64, N
    free(device)

    t["dense_fwd"] = t["dense_fwdbwd"] = None
    if B * V * F32 <= DENSE_MAX_BYTES:
        log(f"  sparse {shape.name}: dense op")
        try:
            dense = sc.to_dense()
            row["dense"] = "densified"
            _time(timer, row, "dense_fwd", lambda: log_lik(dense, la), log)
            _time(timer, row, "dense_fwdbwd", lambda: _grad(lambda a: log_lik(dense, a), la_g),
                  log)
            del dense
        except Exception as e:  # noqa: BLE001
            row["errors"]["dense"] = err_text(e)
        free(device)
    else:
        row["dense"] = f"skipped: dense would be {B * V * F32 / 2**30:.1f} GiB"

    if comp_la is not None:
        K = shape.components
        log(f"  sparse {shape.name}: components K={K}")
        _time(timer, row, "components_fwd", lambda: log_lik_components(sc, comp_la), log)
        single = median(t.get("ext_fwd"))
        comp = median(t.get("components_fwd"))
        ok = comp is not None and single is not None
        row["components"] = {"K": K, "fwd_us": comp, "single_fwd_us": single,
                             "ratio_vs_single": comp / single if ok else None,
                             "ratio_vs_K_single": comp / (K * single) if ok else None}

    ef, efb = median(t.get("ext_fwd")), median(t.get("ext_fwdbwd"))
    row["ratio_fwd_floor"] = None if ef is None else ef / row["floor_us"]
    row["ratio_fwdbwd_floor"] = None if efb is None else efb / row["floor_us"]
    row["ratio_fwdbwd_floor_fwdbwd"] = None if efb is None else efb / row["floor_fwdbwd_us"]
    hf, hfb = median(t.get("handwritten_fwd")), median(t.get("handwritten_fwdbwd"))
    row["speedup_fwd_vs_handwritten"] = None if ef is None or hf is None else hf / ef
    row["speedup_fwdbwd_vs_handwritten"] = None if efb is None or hfb is None else hfb / efb
    del sc
    free(device)
    return row


def bench_sparse(shapes: List[SparseShape], g: torch.Generator, device: torch.device,
                 timer: Timer, bw: float, log: Callable[[str], None]) -> List[dict]:
    """One entry per shape; a shape that fails (out of memory) is an entry
    with its error and no times."""
    out = []
    for shape in shapes:
        log(f"sparse {shape.name} {shape.bxv}")
        try:
            out.append(bench_sparse_shape(shape, g, device, timer, bw, log))
        except Exception as e:  # noqa: BLE001 - report, go on with the other shapes
            out.append({"name": shape.name, "B": shape.B, "V": shape.V,
                        "density": shape.density, "error": err_text(e), "times": {}})
            log(f"  sparse {shape.name} failed: {err_text(e)}")
        free(device)
    return out
