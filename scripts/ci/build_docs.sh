#!/usr/bin/env bash
# The documentation site, built with warnings as errors, offline.
#
#   scripts/ci/build_docs.sh [OUT_DIR]      (default /tmp/docs_html)
#
# Needs the docs extra (pip install -e '.[docs]' or the packages it lists) and
# an importable dirmult_ext: installed, or an in-place build under python/.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-/tmp/docs_html}"
cd "$root"
# The in-place build where there is one; else the installed package.
if compgen -G "$root/python/dirmult_ext/ops/_C*.so" >/dev/null; then
  export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
fi
export MPLBACKEND=Agg
python -m sphinx -W --keep-going -E -b html docs "$out"
echo "docs: $out/index.html"
