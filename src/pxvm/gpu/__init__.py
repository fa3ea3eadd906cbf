"""The seeds' GPU entry points (`pxvm.gpu.executor`); implemented in pxvm.compat."""
