"""Calls each dirmult op with each bad argument of tests/test_errors.py's
OP_ERRORS, on the CPU and on CUDA, in eager mode and from TorchScript, each
call in a process of its own, and prints how the process ended (a Python
RuntimeError is right; a signal is a crash).

Every case runs with the checks this torch gets by default
(DIRMULT_OP_CHECKS unset) and, for the record, in eager mode with the C++
checks alone (DIRMULT_OP_CHECKS=native: a crash there shows that this torch needs the
Python checks; see Note [Stable ABI errors]). Exits 1 when any default case
crashes or does not raise the expected error.

    python scripts/gpu/probe_op_errors.py
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_errors import OP_ERRORS  # noqa: E402

CHILD = r"""
import sys, torch, dirmult_ext
op, args_code, device, how = sys.argv[1:5]
args = eval(f"({args_code},)", {"torch": torch, "d": torch.device(device)})
if how == "torchscript":
    types = ", ".join(f"a{i}: {'bool' if isinstance(a, bool) else 'Tensor'}"
                      for i, a in enumerate(args))
    names = ", ".join(f"a{i}" for i in range(len(args)))
    f = torch.jit.CompilationUnit(f"def f({types}):\n    return torch.ops.dirmult.{op}({names})\n").f
else:
    f = getattr(torch.ops.dirmult, op)
try:
    f(*args)
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
    sys.exit(0)
print("no error")
"""


def probe(op, args, device, how, setting):
    env = dict(os.environ)
    env.pop("DIRMULT_OP_CHECKS", None)
    if setting != "default":
        env["DIRMULT_OP_CHECKS"] = setting
    r = subprocess.run([sys.executable, "-c", CHILD, op, args, device, how], env=env,
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def main():
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, devices {', '.join(devices)}")
    # (op, args, message, device, how, setting): the C++ checks alone in eager
    # mode only, for the record.
    runs = [(name, op, args, message, device, how, setting)
            for device in devices for name, (op, args, message) in OP_ERRORS.items()
            if not (name.endswith("device") and device == "cpu")
            for how, setting in (("eager", "default"), ("torchscript", "default"),
                                 ("eager", "native"))]
    with ThreadPoolExecutor(max_workers=max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
        results = list(pool.map(lambda r: probe(*r[1:3], *r[4:]), runs))
    failures = 0
    for (name, op, args, message, device, how, setting), (rc, out, err) in zip(runs, results):
        ok = rc == 0 and out.startswith("RuntimeError") and re.search(message, out)
        if setting == "default" and not ok:
            failures += 1
        text = ((out if rc == 0 else err).strip().splitlines() or ["(no output)"])
        shown = text[0] if rc == 0 else text[-1]
        print(f"{device:4s} {how:11s} {setting:7s} {name:32s} rc={rc:4d} {'ok ' if ok else 'BAD'} "
              f"{shown[:100]}")
    print(f"{failures} default case(s) crashed or did not raise the expected error")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
