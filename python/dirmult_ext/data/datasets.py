"""Datasets shipped with the package (see ``data/README.md`` for sources and
licenses)."""
from __future__ import annotations

import gzip
import io
from importlib import resources
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["load_digits", "Digits"]


class Digits(NamedTuple):
    """``counts``: (1797, 64) float32 pixel counts 0..16 (8x8 images, row-major);
    ``labels``: (1797,) int64 digits 0..9."""
    counts: Tensor
    labels: Tensor


def load_digits() -> Digits:
    """The UCI optical-recognition-of-handwritten-digits test set (Alpaydin &
    Kaynak 1998, CC BY 4.0): 1797 8x8 images, each pixel the number of on
    bits (0..16) in a 4x4 block, as a count matrix with one row per image.

    Returns:
        :class:`Digits` ``(counts (1797, 64) float32, labels (1797,) int64)``.
    """
    raw = resources.files("dirmult_ext").joinpath("data", "digits.csv.gz").read_bytes()
    with gzip.open(io.BytesIO(raw), "rt") as f:
        arr = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if arr.shape != (1797, 65):
        raise RuntimeError(f"the bundled digits data has shape {arr.shape}, expected (1797, 65)")
    return Digits(torch.from_numpy(arr[:, :64].astype(np.float32)),
                  torch.from_numpy(arr[:, 64].copy()))
