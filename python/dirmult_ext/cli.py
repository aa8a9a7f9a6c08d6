"""The ``dirmult-ext`` command (also ``python -m dirmult_ext``).

    dirmult-ext            build info, then the op on a built-in problem,
                           checked against float64 and timed against eager
    dirmult-ext check      the same
    dirmult-ext bench ...  the benchmark (see dirmult_ext.bench)
    dirmult-ext fit ...    fit a DM / DM mixture to a count matrix
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv.pop(0) if argv and not argv[0].startswith("-") else "check"
    if cmd == "check":
        from .selfcheck import main as run
    elif cmd == "bench":
        from .bench import main as run
    elif cmd == "fit":
        from .fit_cli import main as run
    else:
        print(f"dirmult-ext: unknown command {cmd!r}; use check, bench or fit", file=sys.stderr)
        return 2
    return run(argv) or 0


if __name__ == "__main__":
    sys.exit(main())
