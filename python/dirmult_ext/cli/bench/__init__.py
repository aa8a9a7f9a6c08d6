"""``dirmult-ext bench`` (also ``python -m dirmult_ext.cli.bench``): this
package's ops timed against their peers; see ``cli`` for what is timed.

    timing   the Timer (CUDA events, synced, CUDA-graph replay; median after warm-up)
    cases    shapes and inputs (make_counts, make_log_alpha, rotation, l2_bytes)
    peers    eager reference, torch.compile of it, NumPyro, the copy-bandwidth floor
    measure  one case: this package and its peers timed, errors against float64
    sparse_cases  ``--sparse``: CSR counts against the CSR floor, hand-written PyTorch, dense
    report   targets, environment, text/Markdown/JSON
    cli      the command line
    plot     ``python -m dirmult_ext.cli.bench.plot BENCH.json OUT.png`` (matplotlib)
"""
from .cases import (COMPONENTS_SHAPE, CPU_SHAPES, CUDA_SHAPES, QUICK_SHAPES, Shape, l2_bytes,
                    make_counts, make_log_alpha, parse_shapes, rotation)
from .cli import main
from .timing import Timer

__all__ = ["Shape", "Timer", "l2_bytes", "make_counts", "make_log_alpha", "rotation", "main",
           "parse_shapes", "CPU_SHAPES", "CUDA_SHAPES", "QUICK_SHAPES", "COMPONENTS_SHAPE"]
