"""Pictures of a DM mixture fit (matplotlib, an optional dependency, is
imported here only): the criteria against k, and a heatmap of the top
features' mean proportions per component (as ``DirichletMultinomial``'s
``heatmapdmn`` shows them)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["plot_criteria", "plot_component_heatmap", "require_matplotlib"]


def require_matplotlib():
    """``matplotlib.pyplot`` on the Agg backend, or a clear error."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib, an optional dependency: "
                          "pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_criteria(selection, path: str, criterion: str = "laplace") -> str:
    """Laplace, BIC and AIC against k (a ModelSelection), the k chosen by
    ``criterion`` (``laplace``, ``bic`` or ``aic``) marked; a PNG at ``path``."""
    plt = require_matplotlib()
    tab = selection.table()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for name, label in (("laplace", "Laplace"), ("bic", "BIC"), ("aic", "AIC")):
        ax.plot(tab["k"], tab[name], marker="o", label=label)
    from ..models.criteria import CRITERION_NAMES
    chosen = selection.chosen(criterion)
    ax.axvline(chosen, color="grey", linestyle="--", linewidth=1,
               label=f"chosen k = {chosen} ({CRITERION_NAMES[criterion]})")
    ax.set_xlabel("number of components k")
    ax.set_ylabel("criterion (dmn's scale, lower is better)")
    ax.set_xticks(tab["k"])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def _components(fitted):
    """(K, V) alpha and (K,) weights of a mixture; a one-DM fit (a (V,)
    alpha) is one component of weight 1."""
    alpha = fitted.alpha
    if alpha.dim() == 1:
        return alpha.unsqueeze(0), np.ones(1)
    return alpha, fitted.weights


def top_features(mixture, n: int = 20) -> np.ndarray:
    """Indices of the ``n`` features with the largest mean proportion
    alpha_kv / A_k in any component (a DMMixture or a DMFit)."""
    alpha, _ = _components(mixture)
    mean = alpha / alpha.sum(-1, keepdim=True)
    return np.argsort(-mean.max(0).values.numpy(), kind="stable")[:n]


def plot_component_heatmap(mixture, feature_names: Sequence[str], path: str,
                           n: int = 20) -> str:
    """Mean proportions alpha_kv / A_k of the top ``n`` features (rows) per
    component (columns, by decreasing weight) of a DMMixture, or of a DMFit's
    one component; a PNG at ``path``."""
    plt = require_matplotlib()
    alpha, weights = _components(mixture)
    mean = (alpha / alpha.sum(-1, keepdim=True)).numpy()
    idx = top_features(mixture, n)
    data = mean[:, idx].T
    fig, ax = plt.subplots(figsize=(2 + 0.6 * data.shape[1], 1.5 + 0.3 * len(idx)), dpi=100)
    im = ax.imshow(data, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(idx)))
    ax.set_yticklabels([str(feature_names[i]) for i in idx], fontsize=7)
    ax.set_xticks(range(data.shape[1]))
    ax.set_xticklabels([f"{k + 1}\n({float(w):.2f})" for k, w in enumerate(weights)],
                       fontsize=7)
    ax.set_xlabel("component (weight)")
    fig.colorbar(im, ax=ax, label="mean proportion")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
