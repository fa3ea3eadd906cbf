"""The backends, one package each, never importing one another. Each owns its runtime
(the device API), its kernels and the glue that registers them for the ops
(`op.kernel(name)`), and registers itself with pxvm.core.selection when imported:

- numpy: the reference; every op runs its numpy reference as it is called.
- cpu: SIMD kernels compiled by numba, on the quantized weights; ops without one run
  their reference on the same host arrays.
- webgpu: WGSL kernels on any GPU through wgpu (also the browser page's kernels).
- cuda: PTX kernels that pxvm's Python builders write, on NVIDIA GPUs through the driver.

Adding a backend: a package here and its line below (docs/architecture.md).
"""

# each registers itself when imported, in the order `--backend` lists them
from . import numpy  # noqa: F401, I001
from . import cpu  # noqa: F401
from . import webgpu  # noqa: F401
from . import cuda  # noqa: F401
