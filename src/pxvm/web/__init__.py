"""The browser side of pxvm: a local web server (`pxvm serve`) whose page runs the same
WGSL kernels and .pxi programs with the browser's WebGPU, replaying dispatch plans
recorded by the ops' own Python code (plans.py)."""
