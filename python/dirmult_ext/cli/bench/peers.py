"""What this package is timed against.

* the eager float32 reference, ``dirmult_ext.reference_log_lik``;
* the same function under ``torch.compile``;
* the floor: the bytes that must move divided by the copy bandwidth
  measured in the same run;
* NumPyro's ``DirichletMultinomial.log_prob`` under ``jax.jit`` (and its
  jitted gradient), when jax and numpyro can be imported.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple

import torch

from ...likelihood.log_lik import reference_log_lik
from .cases import F32
from .timing import Timer

eager = reference_log_lik


def grad_of(f: Callable, counts: torch.Tensor, la_g: torch.Tensor) -> torch.Tensor:
    """Forward+backward as timed for every torch peer: the gradient of the
    summed log-likelihood with respect to log_alpha."""
    return torch.autograd.grad(f(counts, la_g).sum(), la_g)[0]


# -------------------------------------------------------------------- floor
def floor_bytes(counts_bytes: int, alpha_numel: int, out_numel: int) -> Tuple[int, int]:
    """(forward, forward+backward) bytes that must move: counts read once,
    log_alpha read, the output written; for forward+backward also the
    incoming gradient read and grad log_alpha written."""
    fwd = counts_bytes + alpha_numel * F32 + out_numel * F32
    return fwd, fwd + out_numel * F32 + alpha_numel * F32


def copy_bandwidth(device: torch.device, timer: Timer, quick: bool) -> dict:
    """Bytes/s of a large ``dst.copy_(src)`` (read + write counted)."""
    if device.type == "cuda":
        nbytes = 2 << 30
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = min(nbytes, int(free * 0.4) // 4096 * 4096)
    else:
        nbytes = 256 << 20
    if quick:
        nbytes = min(nbytes, 32 << 20)
    src = torch.ones(nbytes // F32, device=device, dtype=torch.float32)
    dst = torch.zeros_like(src)  # touched, so the CPU copy does not time page faults
    if timer.mode == "graph":
        # A copy captured in a CUDA graph is a memcpy node, slower than the
        # eager copy kernel (BENCHMARKS.md): the floor is the eager copy's.
        timer = timer.with_timing("queued")
    res = timer(lambda: dst.copy_(src))
    moved = 2 * nbytes
    return {"bytes_copied": nbytes, "bytes_moved": moved, "median_us": res["median_us"],
            "reps": res["reps"], "bytes_per_s": moved / (res["median_us"] * 1e-6),
            "timing": timer.mode}


# ------------------------------------------------------------ torch.compile
def compiler_reset() -> None:
    reset = getattr(getattr(torch, "compiler", None), "reset", None)
    (reset or torch._dynamo.reset)()


def compiled_reference(dynamic: bool) -> Callable:
    """``torch.compile`` of the eager reference (default mode). Static
    shapes unless ``dynamic``; the caller resets the compiler between
    shapes for a fresh static graph each."""
    return torch.compile(reference_log_lik, dynamic=True if dynamic else None)


# ------------------------------------------------------------------ NumPyro
class NumPyroPeer:
    """``numpyro.distributions.DirichletMultinomial(exp(log_alpha),
    total_count=counts.sum(-1)).log_prob(counts)`` under ``jax.jit``, and
    ``jax.grad`` of its sum with respect to log_alpha, jitted.

    It computes the normalized log-likelihood (with the multinomial
    coefficient), so its error is measured against the normalized float64
    reference. jax runs on streams of its own, outside torch's CUDA events:
    its calls block until the result is ready and are timed on the host
    clock (``Timer.host_paired``)."""

    def __init__(self, device: torch.device):
        import jax
        import jax.numpy as jnp
        from numpyro.distributions import DirichletMultinomial

        self.jax = jax
        platform = "gpu" if device.type == "cuda" else "cpu"
        try:
            devices = jax.devices(platform)
        except RuntimeError as e:
            raise RuntimeError(f"jax has no {platform} backend ({e})") from None
        index = device.index or 0
        if index >= len(devices):
            raise RuntimeError(f"jax sees {len(devices)} {platform} device(s), not {device}")
        self.jax_device = devices[index]

        def log_prob(counts, log_alpha):
            dist = DirichletMultinomial(jnp.exp(log_alpha), total_count=counts.sum(-1))
            return dist.log_prob(counts)

        self.fwd = jax.jit(log_prob)
        self.fwdbwd = jax.jit(jax.grad(lambda la, c: log_prob(c, la).sum()))

    def to_jax(self, t: torch.Tensor):
        return self.jax.device_put(t.detach().cpu().numpy(), self.jax_device)

    def calls(self, copies: List[torch.Tensor], log_alpha: torch.Tensor):
        """(forward, forward+backward) callables over the jax copies of
        ``copies`` in turn, each blocking until its result is ready, and the
        forward's output on ``copies[0]`` as a float64 torch tensor."""
        import itertools

        import numpy as np
        jcopies = [self.to_jax(c) for c in copies]
        jla = self.to_jax(log_alpha)
        nxt = itertools.cycle(jcopies).__next__
        first = torch.tensor(np.asarray(self.jax.device_get(self.fwd(jcopies[0], jla))),
                             dtype=torch.float64)

        def fwd():
            return self.fwd(nxt(), jla).block_until_ready()

        def fwdbwd():
            return self.fwdbwd(jla, nxt()).block_until_ready()

        return fwd, fwdbwd, first


def numpyro_peer(device: torch.device) -> Tuple[Optional[NumPyroPeer], str]:
    """The NumPyro peer, or None and the reason it is skipped."""
    # jax would otherwise take most of the GPU's memory on first use.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax  # noqa: F401
        import numpyro  # noqa: F401
    except ImportError as e:
        return None, f"NumPyro peer skipped: jax/numpyro not importable ({e.name or e})"
    try:
        return NumPyroPeer(device), ""
    except Exception as e:  # noqa: BLE001 - a broken jax install skips the peer
        return None, f"NumPyro peer skipped: {type(e).__name__}: {e}"
