"""An import-linter contract type of this repository's: no module imports
another module's private names (``from .x import _y``). The layers and the
absence of cycles are import-linter's own contract types; see the
``[tool.importlinter]`` section of pyproject.toml, run by ``lint-imports``
with this folder on PYTHONPATH (``scripts/ci/lint_imports.sh``)."""
from __future__ import annotations

import ast
import importlib.util
import os

from importlinter import Contract, ContractCheck, fields, output


def _modules(package: str):
    spec = importlib.util.find_spec(package)
    root = spec.submodule_search_locations[0]
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, f), root)[:-3].replace(os.sep, ".")
                name = package if rel == "__init__" else f"{package}.{rel}"
                yield name.removesuffix(".__init__"), os.path.join(folder, f)


def _private_imports(package: str):
    mods = dict(_modules(package))
    for mod, path in sorted(mods.items()):
        is_pkg = path.endswith("__init__.py")
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(package):
                continue
            for alias in node.names:
                name = alias.name
                if (name.startswith("_") and not name.startswith("__") and target != mod
                        and f"{target}.{name}" not in mods):
                    yield f"{mod}:{node.lineno} imports {target}.{name}"


class PrivateNamesContract(Contract):
    """No module of ``packages`` imports a private name of another module."""

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        found = [line for p in self.packages for line in _private_imports(p)]
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["found"]:
            output.print_error(line)
