"""Write a large synthetic sparse count matrix as a ``scipy.sparse.save_npz``
file (CSR), built chunk by chunk of rows and never densified.

Two kinds:

* ``poisson``: each entry is nonzero with probability ``--density``, at
  uniformly drawn columns; a nonzero's value is 1 + Poisson(``--mean``).
* ``mixture``: each row is drawn from one of ``--k`` Dirichlet-multinomial
  components with known concentrations, by the Polya urn: draw i of a row
  (0-based) is a fresh category from ``alpha / A`` with probability
  ``A / (A + i)`` and otherwise repeats a uniformly chosen earlier draw,
  which is exactly DM(N, alpha) and touches only the drawn categories. Row
  totals are uniform in ``[--total-min, --total-max]``. Beside the matrix,
  ``FILE`` with ``.npz`` replaced by ``.truth.npz`` holds ``alpha`` (k, V),
  ``weights`` (k,) and ``labels`` (rows,).

    python scripts/gpu/write_sparse_matrix.py poisson /tmp/m.npz --rows 1000000 --cols 50000
    python scripts/gpu/write_sparse_matrix.py mixture /tmp/mix.npz --rows 1000000 --cols 50000 --k 10
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import scipy.sparse


def _distinct(keys: np.ndarray):
    """The sorted distinct keys and how often each occurs (by a sort: numpy
    2.4's np.unique without counts takes a far slower path for 1e7 keys)."""
    k = np.sort(keys)
    first = np.empty(k.size, dtype=bool)
    first[:1] = True
    np.not_equal(k[1:], k[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    return k[starts], np.diff(np.append(starts, k.size))


def _csr_from_keys(keys: np.ndarray, values: np.ndarray, rows: int, cols: int):
    """CSR parts of a chunk from sorted, distinct ``row * cols + col`` keys."""
    r = keys // cols
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=rows), out=indptr[1:])
    return indptr, (keys % cols).astype(np.int32), values


def poisson_chunk(rng, rows: int, cols: int, density: float, mean: float):
    """A chunk of the ``poisson`` kind: positions drawn with replacement and
    merged (a repeated position is one nonzero), so a row's nonzeros are a
    little under ``density * cols`` when that is large against sqrt(cols)."""
    per_row = rng.binomial(cols, density, size=rows)
    r = np.repeat(np.arange(rows, dtype=np.int64), per_row)
    keys, _ = _distinct(r * cols + rng.integers(0, cols, size=r.size))
    values = (1 + rng.poisson(mean, size=keys.size)).astype(np.float32)
    return _csr_from_keys(keys, values, rows, cols)


def mixture_components(rng, k: int, cols: int, precision: float):
    """``(k, V)`` concentrations: each component's shares are a Dirichlet(0.5)
    draw over the categories (so components differ), times ``precision``."""
    shares = rng.gamma(0.5, size=(k, cols)) + 1e-12
    shares /= shares.sum(1, keepdims=True)
    return precision * shares


def mixture_chunk(rng, rows: int, cols: int, alpha: np.ndarray, weights: np.ndarray,
                  total_min: int, total_max: int):
    """A chunk of the ``mixture`` kind: (CSR parts, component labels)."""
    k = alpha.shape[0]
    labels = rng.choice(k, size=rows, p=weights)
    totals = rng.integers(total_min, total_max + 1, size=rows)
    A = alpha.sum(1)[labels]                                   # (rows,)
    cdf = np.cumsum(alpha / alpha.sum(1, keepdims=True), axis=1)
    cdf[:, -1] = 1.0
    flat_cdf = (cdf + np.arange(k)[:, None]).ravel()
    draws = np.empty((rows, total_max), dtype=np.int64)
    for i in range(total_max):
        fresh = rng.random(rows) * (A + i) < A
        cat = np.empty(rows, dtype=np.int64)
        if fresh.any():
            lf = labels[fresh]
            # one search over the components' CDFs laid end to end, each shifted by its index
            at = np.searchsorted(flat_cdf, rng.random(lf.size) + lf, side="right") - lf * cols
            cat[fresh] = np.minimum(at, cols - 1)
        old = ~fresh
        if old.any():
            j = (rng.random(int(old.sum())) * i).astype(np.int64)
            cat[old] = draws[np.flatnonzero(old), j]
        draws[:, i] = cat
    used = np.arange(total_max)[None, :] < totals[:, None]
    r = np.broadcast_to(np.arange(rows, dtype=np.int64)[:, None], draws.shape)[used]
    keys, counts = _distinct(r * cols + draws[used])
    return _csr_from_keys(keys, counts.astype(np.float32), rows, cols), labels


def write(path: str, kind: str, rows: int, cols: int, *, seed: int = 0, chunk: int = 100_000,
          density: float = 0.002, mean: float = 3.0, k: int = 10, precision: float = 200.0,
          total_min: int = 100, total_max: int = 200, quiet: bool = False):
    """Write the matrix (and for ``mixture`` the ``.truth.npz``); returns it."""
    if rows < 1 or cols < 1 or chunk < 1:
        raise ValueError(f"rows, cols and chunk must be positive, got {rows}, {cols}, {chunk}")
    if not path.endswith(".npz"):
        raise ValueError(f"path must end in .npz, got {path!r}")
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    if kind == "mixture":
        if not 1 <= total_min <= total_max:
            raise ValueError(f"need 1 <= total_min <= total_max, got {total_min}, {total_max}")
        alpha = mixture_components(rng, k, cols, precision)
        weights = rng.dirichlet(np.full(k, 5.0))
        all_labels = []
    elif kind != "poisson":
        raise ValueError(f"kind must be 'poisson' or 'mixture', got {kind!r}")
    indptrs, indices, data = [np.zeros(1, dtype=np.int64)], [], []
    nnz = 0
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        if kind == "poisson":
            ip, ix, v = poisson_chunk(rng, n, cols, density, mean)
        else:
            (ip, ix, v), lab = mixture_chunk(rng, n, cols, alpha, weights, total_min, total_max)
            all_labels.append(lab)
        indptrs.append(ip[1:] + nnz)
        indices.append(ix)
        data.append(v)
        nnz += int(ip[-1])
    indptr = np.concatenate(indptrs)
    if nnz < 2 ** 31:
        indptr = indptr.astype(np.int32)
    m = scipy.sparse.csr_matrix((np.concatenate(data), np.concatenate(indices), indptr),
                                shape=(rows, cols))
    m.has_sorted_indices = True
    scipy.sparse.save_npz(path, m, compressed=False)
    if kind == "mixture":
        np.savez(path[:-4] + ".truth.npz", alpha=alpha, weights=weights,
                 labels=np.concatenate(all_labels))
    if not quiet:
        print(f"wrote {path}: {kind}, {rows} x {cols}, {nnz} nonzeros "
              f"({nnz / (rows * cols):.3%}), {time.perf_counter() - t0:.1f} s")
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=["poisson", "mixture"])
    p.add_argument("path", help="output .npz")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk", type=int, default=100_000, help="rows built at a time")
    p.add_argument("--density", type=float, default=0.002, help="poisson: nonzero fraction")
    p.add_argument("--mean", type=float, default=3.0, help="poisson: value = 1 + Poisson(mean)")
    p.add_argument("--k", type=int, default=10, help="mixture: components")
    p.add_argument("--precision", type=float, default=200.0,
                   help="mixture: each component's sum of concentrations")
    p.add_argument("--total-min", type=int, default=100, help="mixture: smallest row total")
    p.add_argument("--total-max", type=int, default=200, help="mixture: largest row total")
    a = p.parse_args(argv)
    try:
        write(a.path, a.kind, a.rows, a.cols, seed=a.seed, chunk=a.chunk, density=a.density,
              mean=a.mean, k=a.k, precision=a.precision, total_min=a.total_min,
              total_max=a.total_max)
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
