"""The CPU backend's kernels: plain functions of numpy arrays, one module per family,
compiled to SIMD code by numba on first use and cached on disk."""
