"""pxvm's kernels: WGSL files here (read by pxvm.runtime.webgpu.shaders), numba kernels for the CPU backend in `cpu`."""
