#!/usr/bin/env bash
# The import contracts of pyproject.toml ([tool.importlinter]): layers, no
# cycles, no private names across modules. Reads the source tree (nothing is
# imported or built). Needs import-linter (`pip install import-linter`).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHONPATH="$PWD/python:$PWD/scripts/ci${PYTHONPATH:+:$PYTHONPATH}" lint-imports pyproject.toml
