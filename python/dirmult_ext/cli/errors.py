"""A subcommand's user errors (a bad file, argument or data) as one line on
stderr and exit status 2, as argparse reports its own."""
from __future__ import annotations

import functools
import sys

__all__ = ["one_line_errors"]

USER_ERRORS = (ValueError, TypeError, FileNotFoundError, ImportError)


def one_line_errors(command: str):
    """Decorator for a subcommand's ``main(argv)``."""
    def wrap(run):
        @functools.wraps(run)
        def main(argv=None) -> int:
            try:
                return run(argv)
            except USER_ERRORS as e:
                print(f"dirmult-ext {command}: error: {e}", file=sys.stderr)
                return 2
        return main
    return wrap
