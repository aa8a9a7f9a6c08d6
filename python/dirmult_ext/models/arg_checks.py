"""Checks of the high-level functions' arguments (device, seed, number of
components, labels) and of the command line's output paths, each raising a
``ValueError``/``TypeError`` that names the argument and what was expected.
The ops' tensor checks are in ``ops/checks.py``."""
from __future__ import annotations

import numbers
import os
import tempfile
from typing import List, Optional, Union

import numpy as np
import torch

__all__ = ["check_device", "check_seed", "check_k", "check_labels", "check_writable"]


def check_device(device, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` that this machine has: a name torch
    does not know, or a CUDA device torch does not see, is a ``ValueError``
    naming ``name`` (rather than torch's parse error or a driver error at
    the first tensor moved there)."""
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{name} must be a device such as 'cpu', 'cuda' or 'cuda:1', "
                             f"got {device!r}") from None
    else:
        raise TypeError(f"{name} must be a torch.device or a string such as 'cpu' or "
                        f"'cuda', got {type(device).__name__}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {str(device)!r}: torch sees no CUDA device on this "
                             "machine (use 'cpu')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {str(device)!r}: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    elif dev.type not in ("cpu", "meta") and not _backend_available(dev):
        raise ValueError(f"{name} {str(device)!r}: torch has no {dev.type} backend on this "
                         "machine (use 'cpu' or 'cuda')")
    return dev


def _backend_available(dev: torch.device) -> bool:
    mod = getattr(torch, dev.type, None)
    is_available = getattr(mod, "is_available", None)
    try:
        return bool(is_available()) if callable(is_available) else False
    except Exception:  # a backend module that cannot answer has no device
        return False


def check_seed(seed, name: str = "seed") -> Optional[int]:
    """``None`` or an integer (Python or NumPy; not a bool or a string)."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name} must be an integer or None, got {seed!r} "
                        f"({type(seed).__name__})")
    return int(seed)


def check_k(k, name: str = "k") -> Union[int, List[int]]:
    """A positive integer, or an iterable of distinct positive integers (a
    list). A string is neither: ``"12"`` would iterate as ``1, 2``."""
    if isinstance(k, numbers.Integral) and not isinstance(k, bool):
        if k < 1:
            raise ValueError(f"{name} must be a positive integer, got {k!r}")
        return int(k)
    if isinstance(k, (str, bytes, bool, float)) or k is None:
        raise TypeError(f"{name} must be a positive integer or an iterable of them "
                        f"(e.g. range(1, 8)), got {k!r} ({type(k).__name__})")
    try:
        ks = list(k)
    except TypeError:
        raise TypeError(f"{name} must be a positive integer or an iterable of them, "
                        f"got {type(k).__name__}") from None
    for x in ks:
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"{name} must hold integers, got {x!r} ({type(x).__name__}) "
                            f"in {k!r}")
    ks = [int(x) for x in ks]
    if not ks or min(ks) < 1 or len(set(ks)) != len(ks):
        raise ValueError(f"{name} must hold distinct positive integers, got {k!r}")
    return ks


def check_labels(labels, n_rows: int, name: str = "labels") -> np.ndarray:
    """One label per row as a 1-D NumPy array, without missing values (NaN,
    None): a missing label is not a class."""
    lab = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    lab = lab.ravel()
    if lab.shape[0] != n_rows:
        raise ValueError(f"{name} must have one entry per row ({n_rows}), got {lab.shape[0]}")
    if lab.dtype == object:
        missing = np.array([x is None or (isinstance(x, float) and x != x) for x in lab])
    elif np.issubdtype(lab.dtype, np.floating) or np.issubdtype(lab.dtype, np.complexfloating):
        missing = np.isnan(lab)
    else:
        missing = np.zeros(lab.shape, dtype=bool)
    if missing.any():
        i = int(np.argmax(missing))
        raise ValueError(f"{name} has {int(missing.sum())} missing value(s) (NaN or None), "
                         f"the first at row {i}; drop those rows or give them a label")
    return lab


def check_writable(path: str, flag: str = "--out", directory: bool = False) -> None:
    """Fail now, before a long computation, when ``path`` cannot be written:
    its directory (``path`` itself when ``directory``) is created if missing
    and a scratch file is made and removed there."""
    d = path if directory else (os.path.dirname(path) or ".")
    try:
        os.makedirs(d, exist_ok=True)
        if os.path.isdir(path) and not directory:
            raise IsADirectoryError(f"{path} is a directory")
        with tempfile.NamedTemporaryFile(dir=d, prefix=".dirmult-ext-write-check-"):
            pass
    except OSError as e:
        why = e.strerror or str(e)
        raise ValueError(f"{flag} {path}: cannot write there ({why})") from None
