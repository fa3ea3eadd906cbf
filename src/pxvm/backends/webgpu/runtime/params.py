"""Typed kernel parameters: one frozen dataclass per WGSL uniform struct, its fields in
the struct's order with the struct's types, checked against the kernel file's own
declaration before its first use (and for every kernel by the test suite).

    @kernel_params("norm.wgsl")
    class NormParams(KernelParams):
        rows: u32
        row_len: u32
        eps: f32

    NormParams(rows=3, row_len=64, eps=1e-5).pack()   # the struct's 12 bytes
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from dataclasses import dataclass
from typing import Annotated, ClassVar, get_type_hints

from .shaders import struct_fields


@dataclass(frozen=True)
class WgslType:
    """A member type of a uniform struct: its WGSL spelling (no whitespace), how its
    values pack (a `struct` format) and its alignment in a uniform buffer."""

    wgsl: str
    fmt: str
    align: int = 4

    @property
    def nbytes(self) -> int:
        return struct.calcsize("<" + self.fmt)

    @property
    def count(self) -> int:
        """Scalars it holds (a Python tuple of that length when more than one)."""
        return len(struct.unpack("<" + self.fmt, bytes(self.nbytes)))


u32 = Annotated[int, WgslType("u32", "I")]
i32 = Annotated[int, WgslType("i32", "i")]
f32 = Annotated[float, WgslType("f32", "f")]
#: Eight u32 as two vec4 (uniform arrays need 16-byte elements).
u32x8 = Annotated[tuple, WgslType("array<vec4<u32>,2>", "8I", align=16)]


class KernelParams:
    """Base of the classes `kernel_params` makes: `pack()` gives the uniform bytes."""

    KERNELS: ClassVar[tuple[str, ...]]
    STRUCT: ClassVar[str]
    MEMBERS: ClassVar[tuple[tuple[str, WgslType], ...]]
    _packer: ClassVar[struct.Struct]
    _values: ClassVar[operator.attrgetter]
    _flat: ClassVar[bool]

    def pack(self) -> bytes:
        values = self._values(self)
        if len(self.MEMBERS) == 1:
            values = (values,)
        if not self._flat:
            values = [v for value in values
                      for v in (value if isinstance(value, tuple) else (value,))]
        return self._packer.pack(*values)

    @classmethod
    def check(cls, kernel: str) -> None:
        """Raise TypeError unless `kernel` is one of this class's files and declares the
        struct with these members, names and types in this order."""
        if kernel not in cls.KERNELS:
            raise TypeError(f"{cls.__name__} describes the parameters of "
                            f"{', '.join(cls.KERNELS)}, not {kernel}")
        declared = struct_fields(kernel, cls.STRUCT)
        ours = tuple((name, t.wgsl) for name, t in cls.MEMBERS)
        if declared != ours:
            raise TypeError(
                f"{cls.__name__} does not match struct {cls.STRUCT} of {kernel}: the kernel "
                f"declares {_spell(declared)}, the class {_spell(ours)}")


def _spell(members) -> str:
    return "{" + ", ".join(f"{name}: {t}" for name, t in members) + "}"


def kernel_params(*kernels: str, struct_name: str = "Params"):
    """Class decorator: a frozen dataclass describing uniform struct `struct_name` of the
    kernel files `kernels` (which declare it identically)."""

    def make(cls):
        cls = dataclass(frozen=True)(cls)
        hints = get_type_hints(cls, include_extras=True)
        members = tuple((f.name, hints[f.name].__metadata__[0]) for f in dataclasses.fields(cls))
        offset = 0
        for name, wgsl_type in members:
            if offset % wgsl_type.align:
                raise TypeError(f"{cls.__name__}.{name} ({wgsl_type.wgsl}) would sit at byte "
                                f"{offset}, not a multiple of its alignment {wgsl_type.align}")
            offset += wgsl_type.nbytes
        cls.KERNELS = kernels
        cls.STRUCT = struct_name
        cls.MEMBERS = members
        cls._packer = struct.Struct("<" + "".join(t.fmt for _, t in members))
        cls._values = operator.attrgetter(*(name for name, _ in members))
        cls._flat = all(t.count == 1 for _, t in members)
        return cls

    return make
