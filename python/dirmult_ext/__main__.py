"""``python -m dirmult_ext``: the ``dirmult-ext`` command."""
import sys

from .cli import main

sys.exit(main())
