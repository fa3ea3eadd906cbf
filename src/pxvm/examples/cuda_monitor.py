"""The seed's GPU monitor: live utilisation, memory, clocks, temperature and power of the
NVIDIA GPUs, refreshing in the terminal (Ctrl-C stops it).

    python -m pxvm.examples.cuda_monitor [interval seconds]
"""

import sys

from pxvm import PxvmError
from pxvm.tools.monitor import watch

if __name__ == "__main__":
    try:
        watch(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
    except PxvmError as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        pass
