"""Every ```python block of README.md and docs/**/*.md runs as written, on CPU.

A file's blocks run in order in one namespace (a later block may use an
earlier one's names), in a scratch working directory. A block preceded by a
``<!-- no-run: REASON -->`` line is not run; the reason is required. A file
whose blocks import an optional dependency that is not installed is skipped
with that reason.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_RUN = re.compile(r"<!--\s*no-run:(.*?)-->")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
# Optional dependencies an example may import (module -> pip name).
OPTIONAL = {"pyro": "pyro-ppl", "anndata": "anndata", "sklearn": "scikit-learn",
            "scipy": "scipy", "h5py": "h5py", "matplotlib": "matplotlib", "tqdm": "tqdm"}
IMPORT = re.compile(r"^\s*(?:import|from)\s+(\w+(?:\.\w+)*)", re.M)
# The package's interfaces, by the library each imports.
INTERFACES = {"sklearn": "sklearn", "anndata": "anndata", "pyro": "pyro", "plots": "matplotlib"}


def _library(module: str) -> str:
    parts = module.split(".")
    if parts[:2] == ["dirmult_ext", "integrations"] and len(parts) > 2:
        return INTERFACES.get(parts[2], parts[0])
    return parts[0]


SKIP_DIRS = {"_build", "_generated"}


def doc_files():
    files = [ROOT / "README.md"]
    files += sorted(p for p in (ROOT / "docs").rglob("*.md")
                    if not SKIP_DIRS.intersection(p.relative_to(ROOT / "docs").parts))
    return files


def python_blocks(path: Path):
    """[(first line number, source, no-run reason or None)] of the file's
    ```python blocks, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if lang in ("python", "py"):
            prev = next((lines[p] for p in range(i - 1, -1, -1) if lines[p].strip()), "")
            marker = NO_RUN.search(prev)
            reason = marker.group(1).strip() if marker else None
            if marker and not reason:
                raise AssertionError(f"{path.name}:{i}: a no-run marker needs a reason")
            body = [ln[len(indent):] if ln.startswith(indent) else ln for ln in lines[i + 1:j]]
            blocks.append((i + 2, "\n".join(body) + "\n", reason))
        i = j + 1
    return blocks


FILES = [p for p in doc_files() if any(r is None for _, _, r in python_blocks(p))]


def test_examples_are_found():
    # The extractor must see the README's usage block, or this file tests nothing.
    readme = python_blocks(ROOT / "README.md")
    assert len([b for b in readme if b[2] is None]) >= 2
    assert any("dirmult_ext.log_lik(" in src for _, src, _ in readme)
    assert len(FILES) >= 5, [p.name for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_doc_examples_run(path, tmp_path, monkeypatch):
    blocks = [(line, src) for line, src, reason in python_blocks(path) if reason is None]
    used = {_library(m) for _, src in blocks for m in IMPORT.findall(src)}
    for mod in sorted(used & OPTIONAL.keys()):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"its examples need {OPTIONAL[mod]} (pip install {OPTIONAL[mod]})")
    import torch
    # The examples pick "cuda" when there is one; here they run on the CPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    torch.manual_seed(0)
    namespace = {"__name__": "__doc_example__"}
    for line, src in blocks:
        # Line numbers in a traceback are the markdown file's.
        code = compile("\n" * (line - 1) + src, str(path.relative_to(ROOT)), "exec")
        exec(code, namespace)
