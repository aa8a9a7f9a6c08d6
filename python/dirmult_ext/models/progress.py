"""Progress reports for the fits: a tqdm bar when tqdm is installed, plain
lines on stderr when it is not (tqdm is optional).

``progress=None`` (the fits' default) reports only on a terminal and only
once the work has run longer than :data:`DELAY_S` seconds, so short fits
stay silent and long ones never are; ``True`` reports from the start,
terminal or not; ``False`` never.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional

__all__ = ["DELAY_S", "PLAIN_INTERVAL_S", "Progress", "progress_bar"]

#: Seconds of silence before the default (``progress=None``) report appears.
DELAY_S = 2.0
#: Seconds between two plain progress lines (without tqdm).
PLAIN_INTERVAL_S = 5.0


def _isatty(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def _load_tqdm():
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """A tqdm-like counter (``update``, ``set_postfix``, ``close``) that
    shows nothing until ``delay`` seconds have passed, then a tqdm bar, or
    without tqdm one line every ``interval`` seconds."""

    def __init__(self, total: int, desc: str, *, file=None, delay: float = 0.0,
                 interval: float = PLAIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, use_tqdm: bool = True):
        self.total, self.desc, self.delay, self.interval = total, desc, delay, interval
        self.file = sys.stderr if file is None else file
        self.n = 0
        self._clock = clock
        self._t0 = clock()
        self._tqdm = _load_tqdm() if use_tqdm else None
        self._bar = None
        self._postfix: dict = {}
        self._last: Optional[float] = None     # time of the last plain line
        self._pending = False                  # a plain line is due at the next postfix
        self.lines = 0                         # plain lines written

    def update(self, n: int = 1) -> None:
        self._flush()
        self.n += n
        now = self._clock()
        if now - self._t0 < self.delay:
            return
        if self._tqdm is not None:
            if self._bar is None:
                self._bar = self._tqdm(total=self.total, desc=self.desc, file=self.file,
                                       leave=False, initial=self.n)
            else:
                self._bar.update(n)
        elif self._last is None or now - self._last >= self.interval:
            # written at the next set_postfix (or update), so the line carries
            # this step's values
            self._pending, self._last = True, now

    def set_postfix(self, **values) -> None:
        self._postfix = values
        if self._bar is not None:
            self._bar.set_postfix(**values)
        self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        self._pending = False
        extra = ", ".join(f"{k}={v}" for k, v in self._postfix.items())
        print(f"{self.desc}: {self.n}/{self.total} iterations, "
              f"{self._clock() - self._t0:.1f} s" + (f" ({extra})" if extra else ""),
              file=self.file, flush=True)
        self.lines += 1

    def close(self) -> None:
        self._flush()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.lines:
            print(f"{self.desc}: done, {self.n} iterations in "
                  f"{self._clock() - self._t0:.1f} s", file=self.file, flush=True)
            self.lines += 1


def progress_bar(progress: Optional[bool], total: int, desc: str, *, file=None,
                 delay: float = DELAY_S, clock: Callable[[], float] = time.monotonic,
                 use_tqdm: bool = True) -> Optional[Progress]:
    """The report of a loop of ``total`` steps, or None: ``progress`` True
    (from the start), False (none) or None (on a terminal, after ``delay``
    seconds)."""
    file = sys.stderr if file is None else file
    if progress is None:
        if not _isatty(file):
            return None
    elif not progress:
        return None
    else:
        delay = 0.0
    return Progress(total, desc, file=file, delay=delay, clock=clock, use_tqdm=use_tqdm)
