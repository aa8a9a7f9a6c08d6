"""``python -m dirmult_ext.bench``: the benchmark's command line."""
import sys

from .cli import main

sys.exit(main())
