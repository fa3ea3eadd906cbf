"""Adapter discovery and choice: which WebGPU adapter pxvm runs on, and why.

`auto` prefers a discrete GPU over an integrated one over anything else, and never
picks a software rasteriser (lavapipe, llvmpipe, SwiftShader): those are used only
when asked for by `PXVM_DEVICE=...` or `device=` (an index or a substring of the name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ....core.errors import DeviceSelectionError, GpuUnavailableError, NoAdapterError

SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "swiftshader", "softpipe", "warp")
TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}
BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 0, "OpenGL": 2}

#: The limits that matter for compute work, shown by `pxvm info`.
KEY_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffers-per-shader-stage",
)
KEY_FEATURES = ("shader-f16", "timestamp-query", "subgroup", "shader-f64", "shader-int64")


@dataclass
class AdapterDescription:
    index: int
    name: str
    vendor: str
    backend: str
    adapter_type: str
    features: list[str]
    limits: dict[str, int]
    adapter: object = field(repr=False, default=None)

    @property
    def is_software(self) -> bool:
        lowered = self.name.lower()
        return self.adapter_type == "CPU" or any(s in lowered for s in SOFTWARE_NAMES)

    def rank(self) -> tuple[int, int, int]:
        return (
            TYPE_RANK.get(self.adapter_type, 3),
            BACKEND_RANK.get(self.backend, 1),
            self.index,
        )


def import_wgpu():
    """Import wgpu or raise GpuUnavailableError saying how to get it."""
    try:
        import wgpu  # noqa: PLC0415 - optional at import time of pxvm
    except Exception as exc:  # ImportError, or a broken native library
        raise GpuUnavailableError(
            f"wgpu could not be imported ({exc}); install it with `pip install wgpu`"
        ) from exc
    return wgpu


def list_adapters() -> list[AdapterDescription]:
    wgpu = import_wgpu()
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # silences Mesa's warning on headless hosts
    found = []
    for i, adapter in enumerate(wgpu.gpu.enumerate_adapters_sync()):
        info = adapter.info
        found.append(
            AdapterDescription(
                index=i,
                name=info.get("device", "") or info.get("description", ""),
                vendor=info.get("vendor", ""),
                backend=info.get("backend_type", ""),
                adapter_type=info.get("adapter_type", "Unknown"),
                features=sorted(adapter.features),
                limits={k: int(v) for k, v in adapter.limits.items() if k in KEY_LIMITS},
                adapter=adapter,
            )
        )
    return found


def choose_adapter(
    request: str | int | None = None, adapters: list[AdapterDescription] | None = None
) -> tuple[AdapterDescription, str]:
    """Pick an adapter and say why.

    `request` is None/"auto" (best hardware GPU), an index, or a case-insensitive
    substring of the adapter name, backend or type. Falls back to `PXVM_DEVICE`.
    """
    if request is None:
        request = os.environ.get("PXVM_DEVICE", "auto") or "auto"
    if adapters is None:
        adapters = list_adapters()
    if not adapters:
        raise NoAdapterError(
            "no WebGPU adapter found: install a GPU driver with Vulkan/Metal/DX12 "
            "support (on Debian without a GPU: `apt-get install mesa-vulkan-drivers`)",
            other_backend="cpu")
    req = str(request).strip()
    if req.lower() == "auto":
        hardware = [a for a in adapters if not a.is_software]
        if not hardware:
            names = ", ".join(f"{a.index}: {a.name} ({a.backend})" for a in adapters)
            raise NoAdapterError(
                f"only software adapters are present ({names}); auto never picks them. "
                "Ask for one explicitly with PXVM_DEVICE=<index or name>, e.g. "
                "PXVM_DEVICE=llvmpipe", other_backend="cpu")
        best = min(hardware, key=AdapterDescription.rank)
        return best, f"auto: best hardware adapter ({best.adapter_type} on {best.backend})"
    if req.isdigit():
        idx = int(req)
        if idx >= len(adapters):
            raise DeviceSelectionError(
                f"PXVM_DEVICE/device={req!r}: there are only {len(adapters)} adapters "
                f"(0..{len(adapters) - 1}); run `pxvm info` to list them"
            )
        return adapters[idx], f"requested by index {idx}"
    matches = [
        a
        for a in adapters
        if req.lower() in f"{a.name} {a.vendor} {a.backend} {a.adapter_type}".lower()
    ]
    if not matches:
        names = ", ".join(f"{a.index}: {a.name} ({a.backend})" for a in adapters)
        raise DeviceSelectionError(
            f"PXVM_DEVICE/device={req!r} matches no adapter; available: {names}. "
            "Use an index or a part of one of these names"
        )
    best = min(matches, key=AdapterDescription.rank)
    return best, f"requested by name {req!r}"
