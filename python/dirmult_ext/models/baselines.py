"""Baselines the CLI compares the DM classifier with: a seeded train/test
split and multinomial naive Bayes."""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["train_test_split", "multinomial_naive_bayes"]


def train_test_split(n: int, test_fraction: float, seed: int):
    """A seeded random permutation split: (train indices, test indices)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    n_test = max(1, int(round(n * test_fraction)))
    return perm[n_test:], perm[:n_test]


def multinomial_naive_bayes(x_train: Tensor, y_train: Tensor, x_test: Tensor,
                            n_classes: int, smoothing: float = 1.0) -> Tensor:
    """Multinomial naive Bayes with Laplace (add-``smoothing``) estimates:
    log p(c | n) = log prior_c + sum_v n_v log theta_cv + const, theta_c =
    (class column sums + smoothing) normalized. Returns predicted codes (B_test,)."""
    from ..data.sparse_counts import as_sparse_counts, is_sparse_input
    Y = torch.nn.functional.one_hot(y_train, n_classes).to(torch.float64)
    if is_sparse_input(x_train):  # (the same sums from the nonzeros)
        x_train, x_test = as_sparse_counts(x_train), torch_csr(x_test)
        counts = (x_train.transposed() @ Y.to(x_train.device)).T + smoothing
    else:
        x_train = x_train.to(torch.float64)
        counts = Y.T @ x_train + smoothing                           # (C, V)
    log_theta = counts.log() - counts.sum(-1, keepdim=True).log()
    log_prior = (Y.sum(0) / Y.shape[0]).clamp_min(1e-300).log().to(counts.device)
    return (x_test.to(torch.float64) @ log_theta.T + log_prior).argmax(-1).cpu()


def torch_csr(x) -> Tensor:
    """Sparse counts as a float64 torch sparse CSR tensor."""
    from ..data.sparse_counts import csr_tensor, as_sparse_counts
    sc = as_sparse_counts(x)
    return csr_tensor(sc.crow_indices, sc.col_indices, sc.values.double(), sc.shape)
