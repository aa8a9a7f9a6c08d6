"""The ``dirmult-ext`` command (also ``python -m dirmult_ext``).

``dirmult-ext --help`` lists the subcommands; ``dirmult-ext SUB --help``
gives one subcommand's options. Without a subcommand it runs ``check``.
"""
from __future__ import annotations

import sys

# name -> (module, one-line summary); the module's ``main(argv)`` runs it.
_COMMANDS = {
    "check": ("check", "build info; the op checked against float64 and timed (default)"),
    "bench": ("bench", "time the ops against eager PyTorch and torch.compile"),
    "fit": ("fit", "fit a DM or DM mixture to a count file (default: bundled digits)"),
    "regress": ("regress", "DM regression of a count table on covariates"),
}


def _usage() -> str:
    width = max(map(len, _COMMANDS))
    lines = ["usage: dirmult-ext [SUBCOMMAND] [ARGS ...]", "",
             "Dirichlet-multinomial log-likelihood ops for PyTorch.", "",
             "subcommands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in _COMMANDS.items()]
    lines += ["", "Without a subcommand: check. 'dirmult-ext SUBCOMMAND --help' gives "
              "its options."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    cmd = argv.pop(0) if argv and not argv[0].startswith("-") else "check"
    if cmd not in _COMMANDS:
        print(f"dirmult-ext: unknown subcommand {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = __import__(f"{__package__}.{_COMMANDS[cmd][0]}", fromlist=["main"])
    return module.main(argv) or 0


if __name__ == "__main__":
    sys.exit(main())
