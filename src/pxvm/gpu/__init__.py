"""The seeds' GPU entry points (`pxvm.gpu.executor`), kept as a thin layer over the op library."""
