"""Benchmark: pxvm's kernels against numpy and PyTorch, now the command `pxvm bench ops`
(pxvm.tools.bench_ops); this script runs it with the arguments it is given:

    python benchmarks/bench_ops.py --backend webgpu   # pxvm bench ops --backend webgpu
    python benchmarks/bench_ops.py --backend cuda --markdown --json ops.json --plot ops.png
    python benchmarks/bench_ops.py --quick --ops matmul,dot,attention

`pxvm bench ops --help` and `--list` say the rest. `median_time`, the warm-up and median
rule that bench_pxvm.py shares, is the command's own.
"""

from __future__ import annotations

import sys

from pxvm.cli import main
from pxvm.tools.bench_ops import median_time  # noqa: F401 - bench_pxvm.py imports it from here

if __name__ == "__main__":
    sys.argv = ["pxvm", "bench", "ops", *sys.argv[1:]]
    main()
