"""Agreement of a clustering with known labels."""
from __future__ import annotations

import itertools

import numpy as np

__all__ = ["adjusted_rand_index", "best_permutation_accuracy"]


def adjusted_rand_index(a, b) -> float:
    """Adjusted Rand index of two labelings (1: identical up to relabeling,
    about 0: independent). Hubert & Arabie (1985)."""
    a = np.asarray(a).ravel()
    b = np.asarray(b).ravel()
    if a.shape != b.shape:
        raise ValueError(f"labelings must have the same length, got {a.shape} and {b.shape}")
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1), dtype=np.float64)
    np.add.at(table, (ai, bi), 1)

    def comb2(x):
        return (x * (x - 1) / 2).sum()

    s_ij, s_a, s_b = comb2(table), comb2(table.sum(1)), comb2(table.sum(0))
    expected = s_a * s_b / comb2(np.array([len(a)], dtype=np.float64))
    top = 0.5 * (s_a + s_b)
    if top == expected:
        return 1.0
    return float((s_ij - expected) / (top - expected))


def best_permutation_accuracy(pred, truth) -> float:
    """Accuracy of cluster labels ``pred`` against ``truth`` under the best
    one-to-one relabeling (exhaustive; for a handful of clusters)."""
    pred, truth = np.asarray(pred).ravel(), np.asarray(truth).ravel()
    ks = np.unique(np.concatenate([pred, truth]))
    if len(ks) > 8:
        raise ValueError("best_permutation_accuracy is exhaustive: at most 8 labels")
    best = 0.0
    for perm in itertools.permutations(ks):
        m = dict(zip(ks, perm))
        best = max(best, float(np.mean([m[p] == t for p, t in zip(pred, truth)])))
    return best
