"""``cli-help``: a command's ``--help`` text, rendered at build time from the
real argparse parser, so the reference cannot drift from the code.

    ```{cli-help} fit
    ```

runs ``dirmult-ext fit --help`` in-process (``dirmult_ext.cli.main``);
``:module: dirmult_ext.cli.distributed`` runs that module's ``main(["--help"])``
instead (a command started as ``python -m MODULE``). Nothing is fetched or
spawned: it works offline and needs only the importable package.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

# argparse wraps at the terminal width it reads from COLUMNS.
HELP_WIDTH = "90"


def command_help(argv, module=None) -> str:
    if module is None:
        main = importlib.import_module("dirmult_ext.cli").main
    else:
        main = importlib.import_module(module).main
    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        with contextlib.redirect_stdout(out):
            try:
                rc = main(list(argv) + ["--help"])
            except SystemExit as e:  # argparse exits after printing the help
                rc = e.code
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    text = out.getvalue()
    if rc not in (0, None) or not text.strip():
        raise RuntimeError(f"--help of {argv or module!r} exited with {rc!r} and printed "
                           f"{text!r}")
    return text.rstrip() + "\n"


class CliHelp(SphinxDirective):
    optional_arguments = 1
    has_content = False
    option_spec = {"module": directives.unchanged}

    def run(self):
        argv = self.arguments[0].split() if self.arguments else []
        try:
            text = command_help(argv, self.options.get("module"))
        except Exception as e:  # a build warning (an error under -W), not a crash
            raise self.error(f"cli-help {' '.join(argv)}: {e}") from e
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app):
    app.add_directive("cli-help", CliHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
