r"""The fitting engine every model streams its rows through: the row source
(:class:`Rows`), its sufficient statistics, and the Newton / fixed-point
steps of a Dirichlet-multinomial maximum-likelihood fit (:func:`optimize`).
The public :func:`dirmult_ext.fit` is in :mod:`.fit`.

Objective, for rows b with counts n[b, v], totals N_b and weights w_b
(all ones by default), alpha = exp(log_alpha), A = sum_v alpha_v:

    L(alpha) = sum_b w_b [ sum_v lnpoch(alpha_v, n_bv) - lnpoch(A, N_b) + c_b ]

with c_b = log N_b! - sum_v log n_bv! (the normalized pmf; c_b does not
depend on alpha). Its derivatives:

    g_v   = dL/dalpha_v = sum_b w_b [dpoch(alpha_v, n_bv) - dpoch(A, N_b)]
    H     = diag(q) + z 1 1^T,
    q_v   = sum_b w_b [psi1(alpha_v + n_bv) - psi1(alpha_v)]     (<= 0)
    z     = sum_b w_b [psi1(A) - psi1(A + N_b)]                  (>= 0)

with dpoch(a, n) = psi(a + n) - psi(a), psi1 the trigamma function.

Updates (Minka 2000, "Estimating a Dirichlet distribution", section on the
Polya distribution):

* fixed point: alpha_v <- alpha_v * sum_b w_b dpoch(alpha_v, n_bv)
  / sum_b w_b dpoch(A, N_b). A minorize-maximize step: never decreases L.
* Newton, here in eta = log(alpha) so alpha stays positive: the Hessian in
  eta is diag(alpha^2 q + alpha g) + z alpha alpha^T, still diagonal plus
  rank one, inverted in O(V) by Sherman-Morrison. Taken when that Hessian is
  negative definite and the step increases L; otherwise the step is halved
  (at most 3 times) and then the fixed-point step is taken instead.

Sufficient statistics per pass over the rows, which reads the counts once
(Note [Weighted histograms] in docs/ARCHITECTURE.md): per batch the forward
op gives the (b, k) log-likelihoods ll (the mixture's E-step turns them into
the weights), L = sum_b w_b ll_b; the weights summed per distinct (column,
count) pair p, W_p = sum_{b: n_bv = c_p} w_b (one sparse matmul over the
nonzeros, :meth:`Rows.pairs`), give

    alpha_v g_v = sum_{p in column v} W_p adpoch(alpha_v, c_p) - alpha_v D
    q_v         = sum_{p in column v} W_p tpoch(alpha_v, c_p)

and the weights with the terms of each distinct row total give D = sum_b
w_b dpoch(A, N_b) and z = -sum_b w_b tpoch(A, N_b); every term is math.h's
float64 adpoch / a^2 tpoch (``dirmult::poch_terms`` / ``tpoch_terms``),
accurate where psi(a + n) - psi(a) cancels. No autograd backward. With
``batch_size`` the rows are visited in batches (each moved to the device on
its own; the pairs are then grouped per batch and each pass), so a counts
tensor larger than device memory can stay on the CPU; from host memory to
CUDA each batch goes through a pinned staging buffer, copied while the
previous batch is computed on (:mod:`dirmult_ext.data.row_stream`, Note [Row
streaming]). Without ``batch_size``, host counts bound for a CUDA device
whose bytes exceed half its free memory are streamed the same way, in
batches of 1/16 of the free memory (``row_stream.auto_batch_size``).

Convergence: the relative change in L between iterations is at most
``tol`` (|dL| <= tol * max(|L|, 1)) and the largest projected gradient with
respect to log_alpha per unit row weight, max_v |alpha_v g_v| / sum_b w_b,
is at most ``gtol`` (default 0.01 * sqrt(tol): 1e-6 at the default tol).
Concentrations are kept in [min_alpha, 1e12]; a category never observed
has its MLE at alpha_v -> 0 and heads for min_alpha (its gradient is then
excluded from the test). The fixed point converges linearly and slowly
when A is large (weak overdispersion); Newton is the default.

The machinery is vectorized over K independent weighted fits (one
log-alpha row and one weight column each): the mixture M-step, the
class-conditional classifier and the distributed fit reuse it.
"""
from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from ..likelihood.log_lik import log_lik, log_lik_components
from .arg_checks import check_device
from ..data.counts import as_counts
from ..data.counts import RowSource
from ..data.row_stream import auto_batch_size, matrix_bytes, stream_rows
from ..data import sparse_counts
from ..data.sparse_counts import SparseCounts, offset_blocks, value_rows
from ..likelihood.sparse_stats import fit_moments
from .progress import progress_bar

__all__ = ["Rows", "Pairs", "Pre", "Stats", "Reducer", "identity", "as_weights",
           "resolve_device", "prepass", "row_stats", "moment_init", "newton_step",
           "fixed_point_step", "optimize", "init_eta", "check_common", "default_progress",
           "MAX_ALPHA", "HALVINGS", "component_log_lik"]

MAX_ALPHA = 1e12
_MAX_LOG_STEP = 5.0     # largest |change| of log_alpha per Newton step
HALVINGS = 3

Reducer = Callable[[Tensor], Tensor]


def identity(t: Tensor) -> Tensor:
    return t


# ---------------------------------------------------------------------------
# input handling
# ---------------------------------------------------------------------------
def _auto_batch_size(counts, device: torch.device) -> Optional[int]:
    """Rows per batch when host counts are too large for the CUDA device's
    free memory (:func:`~dirmult_ext.data.row_stream.auto_batch_size`), else None."""
    if device.type != "cuda" or counts.device.type != "cpu":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return auto_batch_size(matrix_bytes(counts), counts.shape[0], free)


def resolve_device(counts: Tensor, device) -> torch.device:
    return counts.device if device is None else check_device(device)


def as_weights(weights, B: int, device, name: str = "weights") -> Optional[Tensor]:
    if weights is None:
        return None
    w = torch.as_tensor(weights, dtype=torch.float64)
    if w.shape != (B,):
        raise ValueError(f"{name} must have shape ({B},) (one per row), got {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"{name} must be finite and non-negative")
    return w.to(device)


# ---------------------------------------------------------------------------
# row source and sufficient statistics
# ---------------------------------------------------------------------------
class Pairs(NamedTuple):
    """The distinct (column, count) pairs of a batch's nonzeros, sorted by
    column then count: ``col`` (U,) int64 and ``cnt`` (U,) float64 of each
    pair; ``M`` the (U, b) 0/1 CSR matrix of which rows hold each pair (``M
    @ w`` sums row weights per pair: the responsibility-weighted count
    histograms); ``P`` the (V, U) 0/1 CSR matrix of each column's pairs
    (``P @ x`` sums per-pair terms per column)."""
    M: Tensor
    col: Tensor
    cnt: Tensor
    P: Tensor


def _ones_csr(crow: Tensor, cols: Tensor, shape) -> Tensor:
    """A float64 CSR matrix of ones; its matmul with a dense matrix sums in
    an order fixed by the layout (no atomics on the CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # torch's beta warning for sparse CSR
        ones = torch.ones(cols.shape[0], dtype=torch.float64, device=cols.device)
        return torch.sparse_csr_tensor(crow, cols, ones, shape, check_invariants=False)


def _spmm(m: Tensor, x: Tensor) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return m @ x


def _pairs_of_csc(csc, top: int, kd: torch.dtype, index: torch.dtype):
    """The (column, count) keys ``column * top + count`` of the nonzeros in
    sorted order, grouped (distinct keys, how many of each) with the rows
    holding each key, from the column-sorted copy ``csc`` a block of columns
    at a time: blocks of columns hold disjoint runs of keys, and a column's
    rows are in increasing order there as in the rows' order, so a stable
    sort per block gives the order of one stable sort of every key (Note
    [Host memory of a sparse fit])."""
    ptr, csc_rows, csc_values = csc
    rows = torch.empty(csc_rows.shape[0], dtype=index)
    keys, counts = [], []
    for v0, v1 in offset_blocks(ptr, sparse_counts.ROW_BLOCK_NNZ):
        j0, j1 = int(ptr[v0]), int(ptr[v1])
        cols = torch.repeat_interleave(torch.arange(v0, v1, dtype=kd),
                                       ptr[v0:v1 + 1].diff().long(), output_size=j1 - j0)
        skey, perm = torch.sort(cols * top + csc_values[j0:j1].to(kd), stable=True)
        k, n = torch.unique_consecutive(skey, return_counts=True)
        keys.append(k)
        counts.append(n)
        rows[j0:j1] = csc_rows[j0:j1][perm]
    return torch.cat(keys), torch.cat(counts), rows


class Rows:
    """The rows of a (B, V) counts matrix with (B, K) float64 row weights,
    visited in batches on ``device``. ``weights=None`` means one weight
    column of ones."""

    def __init__(self, counts: Tensor, weights: Optional[Tensor], device: torch.device,
                 batch_size: Optional[int]):
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.device = device
        self.B, self.V = counts.shape
        #: whether the batches come as SparseCounts
        self.sparse = isinstance(counts, SparseCounts) or (
            isinstance(counts, RowSource) and counts.sparse)
        if batch_size is None:
            batch_size = (counts.block_rows if isinstance(counts, RowSource)
                          else _auto_batch_size(counts, device))
        #: whether the counts stay where they are and the batches move
        self.streaming = batch_size is not None
        self.batch_size = batch_size if batch_size is not None else max(self.B, 1)
        # Whole matrix on the device unless streaming.
        self.counts = counts if self.streaming else counts.to(device)
        if weights is not None and weights.dim() == 1:
            weights = weights.unsqueeze(-1)
        self.weights = None if weights is None else weights.to(device, torch.float64)
        self.K = 1 if weights is None else weights.shape[1]
        self.N: Optional[Tensor] = None          # (B,) float64 row totals, set by prepass
        self.c: Optional[Tensor] = None          # (B,) float64 log N! - sum log n!, idem
        self._pairs = {}
        self._totals = {}

    def set_weights(self, weights: Tensor) -> None:
        self.weights = weights.to(self.device, torch.float64)
        self.K = weights.shape[1]

    def pairs(self, cb: Tensor, bi: int) -> "Pairs":
        """The nonzeros of batch ``bi`` (``cb``) grouped by distinct
        (column, count) pair, in column order (:class:`Pairs`), so that the
        statistics' special functions cost O(U) instead of O(nnz). Cached
        unless streaming."""
        hit = self._pairs.get(bi)
        if hit is not None:
            return hit
        # The values and columns as stored, and on the CPU the rows in int32
        # where they fit (M's indices: the product sums in the same order):
        # no float64 or int64 copy per value (Note [Host memory of a sparse fit]).
        b, V = cb.shape
        cpu = cb.device.type == "cpu"
        csc = r = None
        if isinstance(cb, SparseCounts):
            index = torch.int32 if cpu and max(b, cb.nnz) < 2 ** 31 else torch.int64
            c, n = cb.col_indices, cb.values
            csc = cb.kept_csc() if cpu else None
        else:
            r, c = cb.nonzero(as_tuple=True)             # row-major order
            n = cb[r, c]
            index = torch.int32 if cpu and max(b, r.numel()) < 2 ** 31 else torch.int64
            r = r.to(index)

        def value_rows_of():
            return r if r is not None else value_rows(cb.crow_indices, cb.nnz, index)
        top = float(n.max()) + 1.0 if n.numel() else 1.0
        whole = not n.is_floating_point() or bool((n == n.floor()).all())
        if whole and top * V < 2.0 ** 62:
            # one int per (column, count), column-major: each column's pairs
            # adjacent; int32 keys where they fit (a radix sort of half the passes)
            kd = torch.int32 if top * V < 2.0 ** 31 else torch.int64
            if csc is not None:
                ukey, cnt, rows = _pairs_of_csc(csc, int(top), kd, index)
            else:
                key = c.to(kd) * int(top) + n.to(kd)
                skey, perm = torch.sort(key, stable=True)
                del key
                ukey, cnt = torch.unique_consecutive(skey, return_counts=True)
                del skey
                rows = value_rows_of()[perm]
                del perm
            ukey = ukey.long()
            pcol, pcnt = ukey // int(top), (ukey % int(top)).to(torch.float64)
        else:                                             # non-integer counts: no grouping
            perm = torch.sort(c, stable=True)[1]
            pcol, pcnt = c[perm].long(), n[perm].to(torch.float64)
            cnt = torch.ones_like(pcol)
            rows = value_rows_of()[perm]
            del perm
        U = pcol.shape[0]
        crow = torch.zeros(U + 1, dtype=index, device=cb.device)
        crow[1:] = cnt.cumsum(0)
        ccol = torch.searchsorted(pcol, torch.arange(V + 1, device=cb.device))
        out = Pairs(_ones_csr(crow, rows, (U, b)), pcol, pcnt,
                    _ones_csr(ccol, torch.arange(U, device=cb.device), (V, U)))
        if self.batch_size >= self.B:
            self._pairs[bi] = out
        return out

    def totals(self, Nb: Tensor, bi: int):
        """The distinct row totals of batch ``bi``: (N (T,) float64 sorted,
        inverse (b,) int64 with ``N[inverse] == Nb``), so that the terms of
        dpoch(A, N) cost T special functions instead of b. Cached unless
        streaming."""
        hit = self._totals.get(bi)
        if hit is not None:
            return hit
        out = torch.unique(Nb, sorted=True, return_inverse=True)
        if self.batch_size >= self.B:
            self._totals[bi] = out
        return out

    def count_batches(self, batch_size: Optional[int] = None):
        """Yield (start, stop, counts batch on device), batches of
        ``batch_size`` rows (default the fit's); from host memory to CUDA
        pinned and overlapped with the compute (Note [Row streaming])."""
        return stream_rows(self.counts, self.device, batch_size or self.batch_size)

    def batches(self, comps: Optional[Tensor] = None):
        """Yield (counts batch on device, weights (b, k) float64, N (b,) or None)."""
        for s, e, cb in self.count_batches():
            if self.weights is None:
                k = 1 if comps is None else len(comps)
                wb = torch.ones(e - s, k, dtype=torch.float64, device=self.device)
            else:
                wb = self.weights[s:e]
                if comps is not None:
                    wb = wb[:, comps]
            Nb = None if self.N is None else self.N[s:e]
            yield cb, wb, Nb


@dataclass
class Pre:
    """Weighted moments from one pass, per component: W (K,) total weight,
    Wpos (K,) weight of rows with N > 0, Sx/Sx2 (K, V) weighted sums of the
    proportions n/N and their squares, Sinv (K,) weighted sum of 1/N,
    C (K,) weighted normalizing constants, B total rows."""
    W: Tensor
    C: Tensor
    B: int
    Wpos: Optional[Tensor] = None
    Sx: Optional[Tensor] = None
    Sx2: Optional[Tensor] = None
    Sinv: Optional[Tensor] = None


def prepass(rows: Rows, reduce: Reducer = identity, check: bool = True) -> Pre:
    """Row totals N and normalizing constants c (stored on ``rows``),
    validation, weighted moments. Without ``check``, N and c already on
    ``rows`` (from an earlier prepass of the same rows) are reused."""
    K, V, dev = rows.K, rows.V, rows.device
    W = torch.zeros(K, dtype=torch.float64, device=dev)
    Wpos, Sinv, C = W.clone(), W.clone(), W.clone()
    Sx = torch.zeros(K, V, dtype=torch.float64, device=dev)
    Sx2 = Sx.clone()
    Ns, cs = [], []
    bad = torch.zeros((), dtype=torch.float64, device=dev)
    known = not check and rows.N is not None and rows.c is not None
    start = 0
    for cb, wb, Nb in rows.batches():
        cst = rows.c[start:start + wb.shape[0]] if known else None
        start += wb.shape[0]
        if isinstance(cb, SparseCounts):
            N, bad_b, sx, sx2, cb_c = fit_moments(cb, wb, Nb if known else None)
            cst = cb_c if cst is None else cst
        else:
            c = cb.to(torch.float64)
            bad_b = (~torch.isfinite(c)).sum() + (c < 0).sum() if check else bad
            N = Nb if known else c.sum(-1)
            x = c / N.clamp_min(1e-300).unsqueeze(-1)
            wpx = wb * (N > 0).unsqueeze(-1)
            sx, sx2 = wpx.T @ x, wpx.T @ (x * x)
            if cst is None:
                cst = torch.lgamma(N + 1) - torch.lgamma(c + 1).sum(-1)
        if check:
            bad = bad + bad_b
        Ns.append(N)
        pos = N > 0
        wp = wb * pos.unsqueeze(-1)
        W += wb.sum(0)
        Wpos += wp.sum(0)
        Sx += sx
        Sx2 += sx2
        Sinv += (wp / N.clamp_min(1e-300).unsqueeze(-1)).sum(0)
        cs.append(cst)
        C += (wb * cst.unsqueeze(-1)).sum(0)
    empty = torch.zeros(0, dtype=torch.float64, device=dev)
    rows.N = torch.cat(Ns) if Ns else empty
    rows.c = torch.cat(cs) if cs else empty
    flat = reduce(torch.cat([W, Wpos, Sinv, C, Sx.flatten(), Sx2.flatten(),
                             bad.reshape(1),
                             torch.tensor([float(rows.B)], dtype=torch.float64, device=dev)]))
    if check and float(flat[4 * K + 2 * K * V]) > 0:
        raise ValueError("counts must be finite and non-negative")
    W, Wpos, Sinv, C = flat[:4 * K].view(4, K)
    Sx, Sx2 = flat[4 * K:4 * K + 2 * K * V].view(2, K, V)
    return Pre(W, C, int(flat[-1]), Wpos, Sx, Sx2, Sinv)


def moment_init(pre: Pre, min_alpha: float) -> Tensor:
    """Method-of-moments log_alpha (K, V). With proportions x = n / N:
    E[x_v] = p_v and sum_v Var[x_v] = sum_v p_v (1 - p_v) [e + (1 - e)/(A + 1)]
    where e is the mean of 1/N; solve for A, then alpha = A p."""
    Wp = pre.Wpos.clamp_min(1e-300).unsqueeze(-1)
    V = pre.Sx.shape[1]
    p = pre.Sx / Wp
    var = (pre.Sx2 / Wp - p * p).clamp_min(0).sum(-1)
    e = pre.Sinv / Wp.squeeze(-1)
    ratio = var / (p * (1 - p)).sum(-1).clamp_min(1e-300)
    excess = ratio - e
    A = (1 - e) / excess - 1
    A = torch.where((excess > 1e-12) & torch.isfinite(A), A, torch.full_like(A, 1e4))
    A = torch.where(pre.Wpos > 0, A, torch.full_like(A, float(V)))
    A = A.clamp(1e-2, 1e6)
    # a little smoothing so that rarely seen categories do not start at the floor
    lam = 1e-3 / V
    p = (p + lam) / (1 + V * lam)
    p = torch.where(pre.Wpos.unsqueeze(-1) > 0, p, torch.full_like(p, 1.0 / V))
    return (A.unsqueeze(-1) * p).log().clamp(math.log(min_alpha), math.log(MAX_ALPHA))


@dataclass
class Stats:
    """Per component: L (K,) weighted unnormalized log-lik; G (K, V) gradient
    wrt log_alpha (= alpha * g); Q (K, V) = q; Z (K,) = z; D (K,) = sum_b w_b
    dpoch(A, N_b) (the fixed-point denominator)."""
    L: Tensor
    G: Tensor
    Q: Optional[Tensor]
    Z: Optional[Tensor]
    D: Tensor

    def take(self, idx: Tensor) -> "Stats":
        return Stats(self.L[idx], self.G[idx], None if self.Q is None else self.Q[idx],
                      None if self.Z is None else self.Z[idx], self.D[idx])

    def put(self, idx: Tensor, other: "Stats") -> None:
        self.L[idx] = other.L
        self.G[idx] = other.G
        self.D[idx] = other.D
        if self.Q is not None:
            self.Q[idx] = other.Q
            self.Z[idx] = other.Z


def row_stats(rows: Rows, eta: Tensor, comps: Optional[Tensor], hessian: bool,
           reduce: Reducer = identity, reweight=None) -> Stats:
    """One pass over the rows at log_alpha ``eta`` (k, V) float64 for the
    weight columns ``comps`` (all when None); reduced with ``reduce``.

    ``reweight(start, ll, wb)``, if given, is called per batch with the
    batch's first row index, its (b, k) log-likelihoods and stored weights,
    and returns the weights to use instead (the fused E-step of the mixture
    EM).

    The counts are read once per batch, by the forward op (L); G and Q come
    from the weighted histograms of the distinct (column, count) pairs
    (:meth:`Rows.pairs`), D and Z from the terms of each distinct row total
    (:meth:`Rows.totals`): the module docstring, Note [Weighted histograms]."""
    k, V = eta.shape
    dev = eta.device
    eta = eta.detach()
    alpha = eta.exp()
    A = alpha.sum(-1)
    logA = A.log()
    L = torch.zeros(k, dtype=torch.float64, device=dev)
    G = torch.zeros(k, V, dtype=torch.float64, device=dev)   # sum_p W_p adpoch(alpha, c_p)
    D = L.clone()                                             # sum_b w_b adpoch(A, N_b)
    Q = G.clone() if hessian else None                        # sum_p W_p a2tpoch(alpha, c_p)
    Z = L.clone() if hessian else None                        # sum_b w_b a2tpoch(A, N_b)
    etaT = eta.T.contiguous()                                 # (V, k)
    for bi, (cb, wb, Nb) in enumerate(rows.batches(comps)):
        with torch.no_grad():
            if k == 1:
                ll = log_lik(cb, eta[0]).unsqueeze(-1)
            else:
                ll = log_lik_components(cb, eta)                      # (b, k)
        if reweight is not None:
            wb = reweight(bi * rows.batch_size, ll, wb)
        L += (ll * wb).sum(0)
        uN, inv = rows.totals(Nb, bi)
        T = uN.shape[0]
        la, n = logA.expand(T, k).contiguous(), uN.unsqueeze(-1).expand(T, k).contiguous()
        D += (wb * torch.ops.dirmult.poch_terms(la, n)[1][inv]).sum(0)
        if hessian:
            Z += (wb * torch.ops.dirmult.tpoch_terms(la, n)[0][inv]).sum(0)
        pr = rows.pairs(cb, bi)
        U = pr.col.shape[0]
        if U == 0:
            continue
        wp = _spmm(pr.M, wb)                      # (U, k) weighted (column, count) histograms
        la, n = etaT[pr.col], pr.cnt.unsqueeze(-1).expand(U, k).contiguous()
        terms = wp * torch.ops.dirmult.poch_terms(la, n)[1]
        if hessian:                               # one sum per column for both
            terms = torch.cat([terms, wp * torch.ops.dirmult.tpoch_terms(la, n)[0]], 1)
        per_col = _spmm(pr.P, terms).T            # (k or 2k, V)
        G += per_col[:k]
        if hessian:
            Q += per_col[k:]
    parts = [L, G.flatten(), D] + ([Q.flatten(), Z] if hessian else [])
    flat = reduce(torch.cat(parts))
    L, G, D = flat[:k], flat[k:k + k * V].view(k, V), flat[k + k * V:2 * k + k * V]
    # adpoch and a2tpoch carry factors alpha and alpha^2 (A and A^2 for the totals)
    D = D / A
    G = G - alpha * D.unsqueeze(-1)
    if hessian:
        o = 2 * k + k * V
        Q, Z = flat[o:o + k * V].view(k, V) / (alpha * alpha), -flat[o + k * V:] / (A * A)
    return Stats(L.clone(), G, Q, Z, D)


# ---------------------------------------------------------------------------
# update directions
# ---------------------------------------------------------------------------
def newton_step(eta: Tensor, S: Stats, free: Tensor):
    """Newton step in log_alpha, (k, V), and a (k,) mask of where it is
    usable (Hessian negative definite, ascent direction, finite).
    H_eta = diag(d) + z u u^T, d = alpha^2 q + alpha g, u = alpha; fixed
    (non-free) coordinates are left out of the system."""
    alpha = eta.exp()
    g = torch.where(free, S.G, torch.zeros_like(S.G))
    d = torch.where(free, alpha * alpha * S.Q + S.G, torch.full_like(S.G, -1.0))
    u = torch.where(free, alpha, torch.zeros_like(alpha))
    z = S.Z
    gd, ud = g / d, u / d
    denom = 1 + z * (u * ud).sum(-1)
    step = -(gd - ud * (z * (u * gd).sum(-1) / denom).unsqueeze(-1))
    ok = (d < 0).all(-1) & (denom > 0) & torch.isfinite(step).all(-1) & ((g * step).sum(-1) > 0)
    big = step.abs().amax(-1, keepdim=True)
    step = step * torch.where(big > _MAX_LOG_STEP, _MAX_LOG_STEP / big, torch.ones_like(big))
    return torch.where(ok.unsqueeze(-1), step, torch.zeros_like(step)), ok


def fixed_point_step(eta: Tensor, S: Stats) -> Tensor:
    """Minka's fixed point as a log_alpha change: log(num_v / D), num_v =
    sum_b w_b dpoch(alpha_v, n_bv) = g_v + D (clamped at 0: never observed)."""
    alpha = eta.exp()
    D = S.D.unsqueeze(-1)
    num = (S.G / alpha + D).clamp_min(0)
    step = num.log() - D.log()
    return torch.where(D > 0, step, torch.zeros_like(step))


def optimize(rows: Rows, eta: Tensor, pre: Pre, *, method: str, tol: float,
              gtol: float, max_iter: int, min_alpha: float, reduce: Reducer = identity,
              progress: Optional[bool] = False, desc: str = "fit", need_converged: bool = True):
    """Run up to ``max_iter`` iterations on all K components of ``rows``,
    starting at ``eta`` (K, V) float64. Returns (eta, stats, trace (list of
    (K,) normalized log-lik tensors), n_iter, converged (K,) bool, gnorm (K,))."""
    if method not in ("newton", "fixed_point"):
        raise ValueError(f"method must be 'newton' or 'fixed_point', got {method!r}")
    hessian = method == "newton"
    lo, hi = math.log(min_alpha), math.log(MAX_ALPHA)
    K = eta.shape[0]
    eta = eta.clone()
    S = row_stats(rows, eta, None, hessian, reduce)
    W = pre.W
    active = W > 1e-12 * W.sum()
    converged = ~active
    trace = [S.L + pre.C]
    gnorm = torch.zeros(K, dtype=torch.float64, device=eta.device)
    bar = progress_bar(progress, max_iter, desc)
    n_iter = 0
    try:
        for it in range(1, max_iter + 1):
            n_iter = it
            free = (eta > lo + 1e-9) | (S.G > 0)
            fp = fixed_point_step(eta, S)
            if hessian:
                nt, use_newton = newton_step(eta, S, free)
                use_newton = use_newton & active
            else:
                nt, use_newton = fp, torch.zeros(K, dtype=torch.bool, device=eta.device)
            t = torch.ones(K, dtype=torch.float64, device=eta.device)
            pending = active.clone()
            new_eta = eta.clone()
            for _ in range(HALVINGS + 2):
                if not bool(pending.any()):
                    break
                idx = pending.nonzero().squeeze(-1)
                step = torch.where(use_newton.unsqueeze(-1), t.unsqueeze(-1) * nt, fp)[idx]
                cand = (eta[idx] + step).clamp(lo, hi)
                Sc = row_stats(rows, cand, idx if K > 1 else None, hessian, reduce)
                slack = 1e-12 * S.L[idx].abs() + 1e-12
                acc = (Sc.L >= S.L[idx] - slack) | ~use_newton[idx]
                ai = idx[acc]
                if len(ai):
                    new_eta[ai] = cand[acc]
                    S.put(ai, Sc.take(acc.nonzero().squeeze(-1)))
                pending[ai] = False
                rej = idx[~acc]
                t[rej] *= 0.5
                use_newton[rej] &= t[rej] >= 0.5 ** HALVINGS
            eta = new_eta
            Lfull = S.L + pre.C
            dL = (Lfull - trace[-1]).abs()
            trace.append(Lfull)
            free = (eta > lo + 1e-9) | (S.G > 0)
            gnorm = (S.G * free).abs().amax(-1) / W.clamp_min(1e-300)
            conv = (dL <= tol * Lfull.abs().clamp_min(1.0)) & (gnorm <= gtol)
            converged = converged | (conv & active)
            if need_converged:
                active = active & ~conv
            if bar is not None:
                bar.update(1)
                bar.set_postfix(log_lik=f"{float(Lfull.sum()):.6g}")
            if not bool(active.any()):
                break
    finally:
        if bar is not None:
            bar.close()
    return eta, S, trace, n_iter, converged, gnorm


def default_progress(progress, work: int, streaming: bool) -> Optional[bool]:
    """``progress`` for :func:`~dirmult_ext.models.progress.progress_bar`:
    as given, else True (from the start) for streamed rows on a terminal,
    else None (on a terminal once the fit has taken 2 s)."""
    if progress is not None:
        return bool(progress)
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return True if tty and streaming else None


def check_common(method: str, tol: float, max_iter: int, min_alpha: float) -> None:
    if method not in ("newton", "fixed_point"):
        raise ValueError(f"method must be 'newton' or 'fixed_point', got {method!r}")
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol!r}")
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    if not (0 < min_alpha < 1):
        raise ValueError(f"min_alpha must be in (0, 1), got {min_alpha!r}")


def init_eta(init, pre: Pre, V: int, device, min_alpha: float) -> Tensor:
    if init is None or (isinstance(init, str) and init == "moments"):
        return moment_init(pre, min_alpha)
    a = torch.as_tensor(init, dtype=torch.float64)
    if a.shape != (V,):
        raise ValueError(f"init must be None, 'moments' or alpha of shape ({V},), "
                         f"got shape {tuple(a.shape)}")
    if not bool(torch.isfinite(a).all()) or bool((a <= 0).any()):
        raise ValueError("init (alpha) must be finite and positive")
    return a.log().clamp(math.log(min_alpha), math.log(MAX_ALPHA)).to(device).unsqueeze(0)


def component_log_lik(counts: Tensor, log_alpha: Tensor, device=None,
                       batch_size: Optional[int] = None) -> Tensor:
    """(B, K) normalized log DM(counts[b] | alpha_k), float64, on ``device``."""
    counts = as_counts(counts)
    dev = counts.device if device is None else check_device(device)
    la = log_alpha.to(dev, torch.float64)
    if counts.shape[1] != la.shape[1]:
        raise ValueError(f"counts must have {la.shape[1]} columns, got {counts.shape[1]}")
    bs = batch_size or max(counts.shape[0], 1)
    out = [log_lik_components(counts[s:s + bs].to(dev), la, normalize=True)
           for s in range(0, counts.shape[0], bs)]
    if not out:
        return torch.zeros(0, la.shape[0], dtype=torch.float64, device=dev)
    return torch.cat(out)
