"""What ``dirmult-ext fit`` saves of a mixture fit: one ``.npz`` and a
``.csv`` per table (weights, alpha, responsibilities, hard assignments,
criteria), named from one prefix."""
from __future__ import annotations

import csv
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["output_prefix", "save_mixture"]


def output_prefix(out: str) -> str:
    """``--out``: a ``.npz`` file name (the tables beside it, named after
    it) or a directory (created; files ``dmm.npz``, ``dmm_*.csv``)."""
    if out.lower().endswith(".npz"):
        d = os.path.dirname(out)
        if d:
            os.makedirs(d, exist_ok=True)
        return out[:-4]
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, "dmm")


def _write_csv(path: str, header: Sequence[str], rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def save_mixture(prefix: str, mixture, sample_names: List[str], feature_names: List[str],
                 selection=None, extra: Optional[Dict] = None) -> List[str]:
    """Write ``prefix.npz`` and ``prefix_{weights,alpha,responsibilities,
    assignments}.csv`` (plus ``prefix_criteria.csv`` from a ModelSelection);
    components are numbered from 1, by decreasing weight. Returns the paths."""
    K = mixture.n_components
    comps = [f"component_{k + 1}" for k in range(K)]
    w = mixture.weights.numpy()
    alpha = mixture.alpha.numpy()
    R = mixture.responsibilities.numpy()
    assign = R.argmax(-1) + 1
    crit = selection.table() if selection is not None else {
        "k": [K], "log_lik": [mixture.log_lik], "laplace": [mixture.laplace],
        "bic": [mixture.bic], "aic": [mixture.aic]}
    arrays = dict(weights=w, alpha=alpha, log_alpha=mixture.log_alpha.numpy(),
                  responsibilities=R, assignments=assign,
                  sample_names=np.asarray(sample_names), feature_names=np.asarray(feature_names),
                  log_lik=mixture.log_lik, laplace=mixture.laplace, bic=mixture.bic,
                  aic=mixture.aic, n_iter=mixture.n_iter, converged=mixture.converged,
                  **{f"criteria_{c}": np.asarray(v) for c, v in crit.items()})
    arrays.update(extra or {})
    paths = [prefix + ".npz"]
    np.savez(paths[0], **arrays)
    tables = {
        "weights": (["component", "weight"], [[c, f"{x:.10g}"] for c, x in zip(comps, w)]),
        "alpha": (["feature"] + comps,
                  [[f] + [f"{x:.10g}" for x in alpha[:, v]] for v, f in enumerate(feature_names)]),
        "responsibilities": (["sample"] + comps,
                             [[s] + [f"{x:.6g}" for x in r] for s, r in zip(sample_names, R)]),
        "assignments": (["sample", "component"], [[s, int(a)] for s, a in zip(sample_names,
                                                                            assign)]),
        "criteria": (list(crit), [[crit[c][i] for c in crit] for i in range(len(crit["k"]))]),
    }
    for name, (header, rows) in tables.items():
        p = f"{prefix}_{name}.csv"
        _write_csv(p, header, rows)
        paths.append(p)
    return paths
