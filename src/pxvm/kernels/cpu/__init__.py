"""The CPU backend's kernels, compiled to SIMD code by numba on first use and cached on disk."""
