"""How many torch threads a fit runs on (See Note [Fit threads]).

A fit of a small table (rows x categories x components below
:data:`SMALL_WORK`) runs with ``torch.set_num_threads(1)`` and restores
the previous count afterwards: its EM or Newton iterations are many short
parallel regions, and waking the thread pool for each costs more than the
work, many times more when the cores are shared with other processes.

``torch.set_num_threads`` is process-global: while such a fit runs, torch
work on other Python threads of the process also runs on one thread.

The rule applies only while the thread count is the one torch had when
this module was imported (its default); a count the caller chose with
``torch.set_num_threads`` is left alone. ``DIRMULT_FIT_THREADS`` overrides
it: ``auto`` (default) the rule above, ``default`` never change the count,
or a number N: every fit on the CPU runs on N threads.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

import torch

__all__ = ["SMALL_WORK", "fit_threads", "threads_for"]

#: Work per iteration (rows x categories x components) below which a CPU
#: fit runs on one thread. At 2^22 a pass over the rows takes a few
#: milliseconds on one core, the scale at which the pool's wake-ups of the
#: iteration's many small regions are comparable to the work.
SMALL_WORK = 1 << 22

_IMPORT_THREADS = torch.get_num_threads()


def threads_for(work: int, device=None) -> Optional[int]:
    """The thread count a fit of ``work`` (rows x categories x components)
    on ``device`` should run with, or None to leave the count as it is."""
    if device is not None and torch.device(device).type != "cpu":
        return None
    env = os.environ.get("DIRMULT_FIT_THREADS", "auto").strip().lower()
    if env == "default":
        return None
    if env != "auto":
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"DIRMULT_FIT_THREADS must be auto, default or a positive "
                             f"number, got {env!r}") from None
        if n < 1:
            raise ValueError(f"DIRMULT_FIT_THREADS must be >= 1, got {n}")
        return n
    current = torch.get_num_threads()
    if current == 1 or current != _IMPORT_THREADS or work >= SMALL_WORK:
        return None
    return 1


@contextlib.contextmanager
def fit_threads(work: int, device=None) -> Iterator[None]:
    """Run the body with :func:`threads_for`'s thread count, restoring the
    previous count afterwards (also on an exception)."""
    n = threads_for(work, device)
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
