"""The ``dirmult-ext`` command: the launcher (``main``) and one module per
subcommand (``check``, ``fit``, ``regress``, ``bench``), the fit's outputs
(``outputs``) and the data-parallel launcher (``distributed``)."""
from .main import main

__all__ = ["main"]
