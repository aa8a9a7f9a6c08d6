"""Sphinx configuration: the API reference (autodoc + napoleon, from the
installed or PYTHONPATH package), the guides and the existing markdown docs
(myst-parser). Offline: no intersphinx, nothing fetched.

    python -m sphinx -W --keep-going -b html docs /tmp/docs_html
"""
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
# The checkout's package when it is not installed (an in-place build).
try:
    import dirmult_ext  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
    import dirmult_ext  # noqa: F401

project = "dirmult_ext"
author = "dirmult_ext developers"
copyright = "dirmult_ext developers, BSD-3-Clause"
release = dirmult_ext.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_parser",
    "cli_help",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated/*.json", "benchmarks/*.json"]

# Google-style "Args:/Returns:/Attributes:" sections, as the docstrings have them.
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
# Attributes as fields of the class, not as attribute entries that collide
# with the dataclass fields autodoc lists.
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "undoc-members": False,
                           "show-inheritance": False}
# Names are documented where users import them (dirmult_ext.fit, not the
# module that defines it).
add_module_names = True

myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"dirmult_ext {release}"
html_static_path = []


def _benchmark_plot(app):
    """docs/_generated/bench_h200.png from docs/benchmarks/h200_queued.json by
    the package's own plotter (``python -m dirmult_ext.cli.bench.plot``)."""
    import json
    from dirmult_ext.cli.bench.plot import plot
    out = DOCS / "_generated"
    out.mkdir(exist_ok=True)
    with open(DOCS / "benchmarks" / "h200_queued.json") as f:
        result = json.load(f)
    plot(result, str(out / "bench_h200.png"))


# Links the markdown files make to repository files outside docs/ (right on
# GitHub), pointed at the site's page for the same content.
_REPO_LINKS = {"../BENCHMARKS.md": "benchmarks.md", "../README.md": "index.md"}


def _repo_links(app, docname, source):
    if "/" in docname:  # only docs/*.md sit one level below those files
        return
    text = source[0]
    for target, page in _REPO_LINKS.items():
        text = text.replace(f"]({target}", f"]({page}")
    source[0] = text


def _skip_metadata_requests(app, what, name, obj, skip, options):
    # scikit-learn's generated set_*_request methods (metadata routing): its
    # own API, documented there, with references only its docs resolve.
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("source-read", _repo_links)
    app.connect("autodoc-skip-member", _skip_metadata_requests)
    os.environ.setdefault("MPLBACKEND", "Agg")
    app.connect("builder-inited", _benchmark_plot)
