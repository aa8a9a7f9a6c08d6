"""Diagnostics: calls each dirmult op with bad arguments, each case in its own
process, and prints how the process ended (a Python error is right; a signal
is a crash). Used on torch builds where the test suite crashed."""
import subprocess
import sys

CASES = {
    "cpu V mismatch": "torch.ops.dirmult.log_lik(torch.ones(3,5), torch.zeros(4), False)",
    "cpu V mismatch x2": "for _ in range(2):\n    try: torch.ops.dirmult.log_lik(torch.ones(3,5), torch.zeros(4), False)\n    except RuntimeError: pass\nraise RuntimeError('both raised')",
    "cpu half log_alpha": "torch.ops.dirmult.log_lik(torch.ones(3,5), torch.zeros(5, dtype=torch.float16), False)",
    "cpu bool counts": "torch.ops.dirmult.log_lik(torch.ones(3,5, dtype=torch.bool), torch.zeros(5), False)",
    "cpu poch_terms size": "torch.ops.dirmult.poch_terms(torch.zeros(3), torch.zeros(4))",
    "cuda V mismatch": "torch.ops.dirmult.log_lik(torch.ones(3,5,device='cuda'), torch.zeros(4,device='cuda'), False)",
    "cuda half log_alpha": "torch.ops.dirmult.log_lik(torch.ones(3,5,device='cuda'), torch.zeros(5, dtype=torch.float16,device='cuda'), False)",
    "aten error": "torch.ones(3).view(2)",
}

for name, body in CASES.items():
    code = "import torch, dirmult_ext\n" + body
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    last = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1][:150]
    print(f"{name:22s} rc={r.returncode:4d}  {last}")
