"""Progress reports: shown after the delay on a terminal, never on a pipe
unless asked, plain lines when tqdm is not installed."""
import io
import os
import subprocess
import sys
import textwrap

import dirmult_ext
from dirmult_ext.models.progress import Progress, progress_bar


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_default_waits_for_the_delay_on_a_terminal_and_stays_off_a_pipe():
    clock = Clock()
    out = Tty()
    bar = progress_bar(None, 50, "fit_mixture k=3", file=out, delay=2.0, clock=clock,
                       use_tqdm=False)
    for _ in range(5):                          # 1.5 s in all: silent
        clock.t += 0.3
        bar.update(1)
        bar.set_postfix(log_lik="-10")
    assert out.getvalue() == ""
    clock.t += 0.6                              # past 2 s: a line, with this step's values
    bar.update(1)
    bar.set_postfix(log_lik="-9.5")
    first = out.getvalue()
    assert "fit_mixture k=3: 6/50 iterations" in first and "log_lik=-9.5" in first
    clock.t += 1.0                              # within the plain-line interval: no line
    bar.update(1)
    bar.set_postfix(log_lik="-9.4")
    assert out.getvalue() == first
    bar.close()
    assert "done, 7 iterations" in out.getvalue()
    assert progress_bar(None, 50, "x", file=io.StringIO()) is None      # not a terminal
    assert progress_bar(False, 50, "x", file=Tty()) is None
    assert progress_bar(True, 50, "x", file=io.StringIO()) is not None  # asked for


def test_a_short_loop_prints_nothing():
    clock = Clock()
    out = Tty()
    bar = Progress(10, "fit", file=out, delay=2.0, clock=clock, use_tqdm=False)
    for _ in range(10):
        clock.t += 0.1
        bar.update(1)
    bar.close()
    assert out.getvalue() == ""


def test_cli_fit_and_fit_mixture_without_tqdm(tmp_path):
    """tqdm made unimportable (sys.modules['tqdm'] = None), progress forced
    on: the fits run and report in plain lines."""
    import numpy as np
    rng = np.random.default_rng()
    x = rng.integers(0, 20, size=(60, 5))
    x[:, 0] += 1
    path = tmp_path / "counts.csv"
    np.savetxt(path, x, fmt="%d", delimiter=",")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["tqdm"] = None
        import torch
        import dirmult_ext
        from dirmult_ext.cli.main import main
        rc = main(["fit", {str(path)!r}, "--k", "2", "--progress", "--n-init", "1",
                   "--n-screen", "0", "--device", "cpu"])
        assert rc == 0, rc
        m = dirmult_ext.fit_mixture(torch.tensor({x.tolist()!r}).float(), 2, progress=True,
                                    n_init=1)
        print("ok", m.n_components)
    """)
    # (the package the suite imports, installed or in place)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(dirmult_ext.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [pkg_parent, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ok 2" in r.stdout
    assert "fit_mixture k=2: " in r.stderr and "iterations" in r.stderr, r.stderr
    assert "ModuleNotFoundError" not in r.stderr
