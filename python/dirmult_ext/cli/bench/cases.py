"""The benchmark's shapes and inputs.

Counts are float32 of shape (B, V): integers 0..9, or, for a sparse shape,
a fraction ``density`` of nonzeros valued 1 + Poisson(3) stored dense.
``log_alpha`` is float32 ~ U(-2, 3), one row shared by all rows of counts
unless a case says otherwise.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

F32 = 4  # bytes per float32 element
SPARSE_DENSITY = 0.01


@dataclass
class Shape:
    name: str
    B: int
    V: int
    density: Optional[float] = None  # None: integers 0..9; else that fraction nonzero, 1+Poisson(3)

    @property
    def bxv(self) -> str:
        s = f"{self.B}x{self.V}"
        return s if self.density is None else f"{s}:{self.density:g}"


CUDA_SHAPES = [Shape("seed", 512, 256), Shape("mid", 8192, 1024), Shape("tall", 65536, 1024),
               Shape("wide", 64, 262144), Shape("sparse", 16384, 16384, SPARSE_DENSITY)]
# seed and mid as on the GPU; tall, wide and sparse scaled down (same kind
# of data; tall stays tall, wide keeps V = 262144) so that a CPU run takes a
# minute or two on two idle cores.
CPU_SHAPES = [Shape("seed", 512, 256), Shape("mid", 8192, 1024), Shape("tall", 16384, 256),
              Shape("wide", 8, 262144), Shape("sparse", 2048, 4096, SPARSE_DENSITY)]
QUICK_SHAPES = [Shape("seed", 128, 64), Shape("mid", 256, 128), Shape("tall", 1024, 32),
                Shape("wide", 4, 4096), Shape("sparse", 256, 512, 0.05)]
DEFAULT_SHAPES = {"cuda": CUDA_SHAPES, "cpu": CPU_SHAPES, "quick": QUICK_SHAPES}
COMPONENTS_SHAPE = {"cuda": (65536, 1024), "cpu": (4096, 1024), "quick": (128, 64)}

_SHAPE_RE = re.compile(r"^(?P<name>[A-Za-z_][\w\-]*)(=(?P<B>\d+)x(?P<V>\d+)(:(?P<d>[0-9.eE\-]+))?)?$")


def parse_shapes(specs: Sequence[str], defaults: List[Shape]) -> List[Shape]:
    """``name`` selects a default shape; ``name=BxV[:density]`` overrides or
    adds one. Entries may also be comma-separated."""
    by_name = {s.name: s for s in defaults}
    out: List[Shape] = []
    for spec in (x for item in specs for x in item.split(",") if x):
        m = _SHAPE_RE.match(spec.strip())
        if not m:
            raise ValueError(f"bad shape {spec!r}; use name or name=BxV[:density]")
        name = m["name"]
        if m["B"] is None:
            if name not in by_name:
                raise ValueError(f"unknown shape {name!r}; defaults are {', '.join(by_name)}")
            shape = by_name[name]
        else:
            density = float(m["d"]) if m["d"] else (SPARSE_DENSITY if name == "sparse" else None)
            if density is not None and not 0.0 < density <= 1.0:
                raise ValueError(f"density must be in (0, 1], got {density} in {spec!r}")
            shape = Shape(name, int(m["B"]), int(m["V"]), density)
            if shape.B < 1 or shape.V < 1:
                raise ValueError(f"empty shape in {spec!r}")
        out = [s for s in out if s.name != name] + [shape]
    return out


def parse_bxv(text: str) -> Tuple[int, int]:
    m = re.match(r"^(\d+)x(\d+)$", text)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"expected BxV with B, V >= 1, got {text!r}")
    return int(m[1]), int(m[2])


def make_counts(shape: Shape, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """float32 (B, V) counts on ``device``, never all zeros."""
    B, V = shape.B, shape.V
    if shape.density is None:
        counts = torch.randint(0, 10, (B, V), generator=g, device=device, dtype=torch.float32)
    else:
        mask = torch.rand((B, V), generator=g, device=device) < shape.density
        nnz = int(mask.sum())
        vals = 1.0 + torch.poisson(torch.full((nnz,), 3.0, device=device), generator=g)
        counts = torch.zeros((B, V), device=device, dtype=torch.float32)
        counts.masked_scatter_(mask, vals)
        del mask, vals
    if not bool(counts.any()):  # a kernel could skip an all-zero matrix
        counts[0, 0] = 1.0
    return counts


def make_log_alpha(shape, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """float32 log-concentrations of ``shape`` ~ U(-2, 3) on ``device``."""
    return torch.empty(shape, device=device, dtype=torch.float32).uniform_(-2.0, 3.0, generator=g)


def rotation_copies(counts: torch.Tensor, cache_bytes: int) -> List[torch.Tensor]:
    """``counts`` and enough copies of it that together they do not fit in
    a cache of ``cache_bytes`` (three times its size; at most 64 tensors).
    Just ``[counts]`` when one copy is already that large or there is no
    cache to defeat (cache_bytes 0)."""
    nbytes = counts.numel() * counts.element_size()
    copies = 1 if cache_bytes <= 0 or nbytes == 0 else min(64, -(-3 * cache_bytes // nbytes))
    return [counts] + [counts.clone() for _ in range(copies - 1)]


def rotation(counts: torch.Tensor, cache_bytes: int) -> Callable[[], torch.Tensor]:
    """A function returning, call after call, the tensors of
    ``rotation_copies`` in turn, so that timed calls read device memory as
    a first call would."""
    sets = rotation_copies(counts, cache_bytes)
    if len(sets) == 1:
        return lambda: counts
    return itertools.cycle(sets).__next__


def l2_bytes(device: torch.device) -> int:
    """The L2 cache size of a CUDA device; 0 on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
