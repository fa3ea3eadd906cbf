"""pxvm's tools for a device: `pxvm bench ops` (bench_ops.py: kernel times next to numpy's
and PyTorch's), `pxvm tune` (tune.py: the choices pxvm.core.tuning keeps per device) and
`pxvm monitor` (monitor.py: NVIDIA GPUs through NVML)."""
