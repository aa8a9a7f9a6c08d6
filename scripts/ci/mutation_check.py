#!/usr/bin/env python
"""Mutation check: each wrong variant of the code must make the tests fail.

Every mutant replaces one small, stable snippet of the package with a wrong
variant, in a temporary copy of python/dirmult_ext (never in the working
tree), and runs the test files that must catch it against that copy. A
mutant survives when those tests pass; the script prints one line per
mutant and exits 1 if any survives. A snippet that is not found exactly once
is an error (exit 2), not a pass: the code moved, and the mutant needs
updating. Before the mutants, the same tests run against the unmutated copy
and must pass (otherwise a failure would prove nothing).

Python-level mutants need no rebuild. --cpp adds C++ mutants (a copy of the
source tree, a CPU-only build per mutant: about a minute each on 2 cores).

    PYTHONPATH= /work/venv/bin/python scripts/ci/mutation_check.py [--cpp] [--only NAME ...]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "dirmult_ext"


@dataclass
class Mutant:
    name: str
    path: str      # relative to the package (Python) or to the repository (C++)
    old: str       # the snippet; must occur exactly once
    new: str
    tests: tuple   # pytest node ids or files, relative to the repository
    cpp: bool = False


MUTANTS = [
    Mutant("backward_sign", "ops/dense.py",
           "grad_la if ctx.needs_input_grad[1] else None",
           "-grad_la if ctx.needs_input_grad[1] else None",
           ("tests/test_log_lik.py::test_gradient_matches_float64_formula",
            "tests/test_op_compat.py::test_module_reduction_eager_and_scripted")),
    Mutant("backward_scale", "ops/dense.py",
           "grad_la if ctx.needs_input_grad[1] else None",
           "0.01 * grad_la if ctx.needs_input_grad[1] else None",
           ("tests/test_log_lik.py::test_training_follows_the_float64_formula",
            "tests/test_log_lik.py::test_gradient_matches_float64_formula")),
    Mutant("single_pass_sign", "ops/dense.py",
           "return None, ctx.grad_of_sum * grad.reshape(-1)[0], None",
           "return None, -ctx.grad_of_sum * grad.reshape(-1)[0], None",
           ("tests/test_log_lik_with_grad.py::test_reduction_takes_the_single_pass",)),
    Mutant("single_pass_unscaled", "ops/dense.py",
           "return None, ctx.grad_of_sum * grad.reshape(-1)[0], None",
           "return None, ctx.grad_of_sum, None",
           ("tests/test_log_lik_with_grad.py::test_reduction_takes_the_single_pass",)),
    Mutant("components_backward_scale", "ops/components.py",
           "return None, grad_la, None",
           "return None, 1.001 * grad_la, None",
           ("tests/test_log_lik_components.py::test_gradient_matches_float64",)),
    Mutant("reduction_mean", "likelihood/log_lik.py",
           "return out.sum() / out.numel()",
           "return out.sum() / (out.numel() + 1)",
           ("tests/test_log_lik_with_grad.py::test_reduction_takes_the_single_pass",
            "tests/test_op_compat.py::test_module_reduction_eager_and_scripted")),
    Mutant("classifier_no_prior", "models/classifier.py",
           "return ll + self.log_prior_.to(ll.device)",
           "return ll",
           ("tests/test_classifier.py",)),
    Mutant("mixture_local_e_step", "models/mixture.py",
           "tq = reduce(torch.cat([est.total.reshape(1), est.q_old]))",
           "tq = torch.cat([est.total.reshape(1), est.q_old])",
           ("tests/test_distributed_mixture.py::test_two_ranks_equal_fit_mixture",)),
    Mutant("fit_alpha_scaled", "models/fit.py",
           "la = eta[0].detach().cpu()",
           "la = eta[0].detach().cpu() + math.log(1.1)",
           ("tests/test_fit.py::test_recovery_of_known_alpha",)),
    Mutant("sampler_last_category", "likelihood/distribution.py",
           "torch.multinomial(probs, nmax, replacement=True)",
           "torch.full((probs.shape[0], nmax), probs.shape[1] - 1, dtype=torch.int64, "
           "device=probs.device)",
           ("tests/test_distribution.py", "tests/test_fit.py::test_recovery_of_known_alpha")),
    Mutant("cpp_row_term_dropped", "src/cpu/log_lik_cpu.cpp",
           "double t = -lnpoch<double>(A, std::log(A), N);",
           "double t = 0.0;",
           ("tests/test_log_lik.py::test_forward_matches_float64",), cpp=True),
    # The shared-alpha backward without its -a_v sum_b g_b dpoch(A, N_b)
    # term: the blocks of rows, and the few long rows split in column chunks.
    Mutant("cpp_backward_total_term_dropped", "src/cpu/log_lik_cpu.cpp",
           "s += N == N ? g * dpoch<double>(sa.total, N) : kNaN;",
           "s += N == N ? 0.0 : kNaN;",
           ("tests/test_log_lik_components.py::test_gradient_matches_float64",
            "tests/test_log_lik.py::test_gradient_matches_float64_formula"), cpp=True),
    Mutant("cpp_few_rows_backward_total_term_dropped", "src/cpu/log_lik_cpu.cpp",
           "if (g != 0.0) S += N[b] == N[b] ? g * dpoch<double>(sa.total, N[b]) : kNaN;",
           "if (g != 0.0) S += N[b] == N[b] ? 0.0 : kNaN;",
           ("tests/test_log_lik.py::test_few_long_rows_forward_and_gradient_match_float64",), cpp=True),
]


class SnippetError(RuntimeError):
    pass


def patch(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    n = text.count(old)
    if n != 1:
        raise SnippetError(f"{path}: snippet found {n} times (expected once): {old!r}")
    path.write_text(text.replace(old, new))


def pytest_run(pythonpath: Path, tests, stop_first: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(pythonpath), PYTHONDONTWRITEBYTECODE="1")
    env.pop("DIRMULT_CUDA_COMPONENTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
           *(["-x"] if stop_first else []), *tests]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def imported_from(pythonpath: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-c", "import dirmult_ext; print(dirmult_ext.__file__)"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def copy_package(dest: Path) -> Path:
    """The package's sources copied, its native libraries linked (read only)."""
    def link_or_copy(src, dst):
        if src.endswith(".so"):
            os.symlink(src, dst)
        else:
            shutil.copy2(src, dst)
    shutil.copytree(PACKAGE, dest / "dirmult_ext", copy_function=link_or_copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    # A checkout without an in-place build (CI installs the wheel): the
    # installed package's native libraries.
    if not list((dest / "dirmult_ext" / "ops").glob("_C*.so")):
        for lib in installed_natives():
            os.symlink(lib, dest / "dirmult_ext" / "ops" / lib.name)
    return dest


def installed_natives() -> list:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; "
         "print(u.find_spec('dirmult_ext').submodule_search_locations[0])"],
        env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True).stdout.strip()
    libs = sorted((Path(where) / "ops").glob("_C*.so")) if where else []
    if not libs:
        sys.exit("mutation_check: no built dirmult_ext found (build in place or install the wheel)")
    return libs


def copy_sources(dest: Path) -> Path:
    """The repository's tracked and unignored files (no build outputs)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def build_cpu(tree: Path) -> None:
    env = dict(os.environ, DIRMULT_WITH_CUDA="0", DIRMULT_BUILD_JOBS="2")
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-b",
                    str(tree / "_build"), "-t", str(tree / "_tmp")],
                   cwd=tree, env=env, capture_output=True, text=True, check=True)


def summary(proc: subprocess.CompletedProcess) -> str:
    """pytest's last line, and the first failed test (what caught the mutant)."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        return " ".join(proc.stderr.strip().splitlines()[-1:])
    failed = next((ln.split(" - ")[0][len("FAILED "):] for ln in lines if ln.startswith("FAILED ")),
                  "")
    return lines[-1].strip("= ") + (f" ({failed})" if failed else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpp", action="store_true", help="add the C++ mutants (rebuilds)")
    ap.add_argument("--only", nargs="*", help="run only these mutants")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args()
    mutants = [m for m in MUTANTS if args.cpp or not m.cpp]
    if args.only:
        unknown = set(args.only) - {m.name for m in MUTANTS}
        if unknown:
            print(f"unknown mutants: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        mutants = [m for m in MUTANTS if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:32s} {m.path}: {', '.join(m.tests)}")
        return 0
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="dirmult_mutants_") as tmp:
        tmp = Path(tmp)
        # Every snippet first: a moved snippet fails before any test runs.
        errors = []
        for m in mutants:
            src = (ROOT / m.path) if m.cpp else (PACKAGE / m.path)
            count = src.read_text().count(m.old) if src.exists() else 0
            if count != 1:
                errors.append(f"{m.name}: {src.relative_to(ROOT)}: snippet found {count} times "
                              f"(expected once): {m.old!r}")
        if errors:
            print("\n".join(["ERROR " + e for e in errors]), file=sys.stderr)
            return 2

        clean = copy_package(tmp / "clean")
        where = imported_from(clean)
        if not where.startswith(str(clean)):
            print(f"ERROR the tests would import dirmult_ext from {where}, not the copy",
                  file=sys.stderr)
            return 2
        py_tests = sorted({t for m in mutants for t in m.tests})
        if py_tests:
            base = pytest_run(clean, py_tests, stop_first=False)
            if base.returncode != 0:
                print(f"ERROR the unmutated package fails the tests: {summary(base)}\n"
                      f"{base.stdout[-3000:]}", file=sys.stderr)
                return 2
            print(f"baseline: {summary(base)}")

        survivors = 0
        for i, m in enumerate(mutants):
            t0 = time.time()
            if m.cpp:
                tree = copy_sources(tmp / f"tree{i}")
                patch(tree / m.path, m.old, m.new)
                build_cpu(tree)
                pythonpath = tree / "python"
            else:
                pythonpath = copy_package(tmp / f"mutant{i}")
                patch(pythonpath / "dirmult_ext" / m.path, m.old, m.new)
            proc = pytest_run(pythonpath, m.tests, stop_first=True)
            if proc.returncode == 1:
                verdict = "killed"
            elif proc.returncode == 0:
                verdict, survivors = "SURVIVED", survivors + 1
            else:  # collection error, crash, usage: not a proof either way
                print(f"ERROR {m.name}: pytest exited {proc.returncode}\n{proc.stdout[-3000:]}"
                      f"{proc.stderr[-3000:]}", file=sys.stderr)
                return 2
            print(f"{verdict:8s} {m.name:32s} {time.time() - t0:5.1f}s  {summary(proc)}", flush=True)
    print(f"{len(mutants)} mutants, {survivors} survived, {time.time() - start:.0f}s")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
