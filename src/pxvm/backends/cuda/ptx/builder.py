"""A small PTX builder: pxvm's CUDA kernels are Python functions that emit PTX through it,
so no nvcc, NVRTC or LLVM is needed at run time (the driver compiles PTX itself).

    k = Kernel("scale", [("x", "u64"), ("y", "u64"), ("n", "u32"), ("factor", "f32")])
    x, y, n, factor = k.params()
    i = k.global_index()
    with k.if_(k.setp("lt.u32", i, n)):
        v = k.load("f32", k.element(x, i, 4))
        k.store("f32", k.element(y, i, 4), k.op("mul.f32", v, factor))
    print(module([k], "sm_90"))

Registers are typed and numbered per kernel (`k.reg("f32")` -> %f3); `k.op(instr, *srcs)`
emits `instr dst, srcs..;` into a new register of the instruction's result type and
returns it; `k.emit(text)` takes any instruction as written. Guards are predicates
(`@%p1`), labels and branches are plain. Names follow the PTX ISA; the builder checks
what is cheap to check (types, that registers exist, balanced `if_`) and ptxas the rest.
"""

from __future__ import annotations

import struct
from contextlib import contextmanager
from dataclasses import dataclass, field

from ....core.errors import PxvmError

#: PTX ISA version of the modules: 8.0 is CUDA 12.0's, enough for sm_90 and every
#: instruction used here; newer drivers compile it too.
PTX_VERSION = "8.0"
ARCHS = ("sm_80", "sm_90")
#: The first architecture with programmatic dependent launch (griddepcontrol).
DEPENDENT_LAUNCH_ARCH = 90
#: the body line Kernel.wait_for_predecessors() leaves, replaced by text()
_WAIT_MARK = "    // wait for predecessors"
_WAIT_LINES = ["    griddepcontrol.wait;", "    griddepcontrol.launch_dependents;"]

# the register class a value of each type lives in, and its names' prefix (PTX's usual)
_CLASS = {"pred": "pred", "b16": "b16", "f16": "b16", "u16": "b16", "s16": "b16",
          "b32": "b32", "u32": "b32", "f16x2": "b32",
          "s32": "b32", "f32": "f32", "b64": "b64", "u64": "b64", "s64": "b64",
          "f64": "f64"}
_CLASS_PREFIX = {"pred": "p", "b16": "h", "b32": "r", "f32": "f", "b64": "rd", "f64": "fd"}


class PtxError(PxvmError, ValueError):
    """A kernel was built or asked for wrongly (a bad type, unbalanced blocks, an unknown
    kernel or architecture)."""


@dataclass(frozen=True)
class Reg:
    """A register: its PTX name and type."""

    name: str
    type: str

    def __str__(self) -> str:
        return self.name


def f32(value: float) -> str:
    """A float32 immediate as PTX writes it exactly (0fXXXXXXXX)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]


def _result_type(instr: str) -> str:
    """The type of an instruction's destination: its last type suffix (`add.f32` ->
    f32, `setp.lt.u32` -> pred, `cvt.rn.f32.u32` -> f32, `mul.wide.u32` -> u64)."""
    parts = instr.split(".")
    if parts[0] == "setp":
        return "pred"
    if parts[0] == "cvt":
        return next(p for p in parts[1:] if p in _CLASS)
    types = [p for p in parts[1:] if p in _CLASS]
    if not types:
        raise PtxError(f"cannot tell the result type of {instr!r}; use emit()")
    t = types[-1]
    if "wide" in parts:
        return {"u32": "u64", "s32": "s64", "u16": "u32", "s16": "s32"}[t]
    return t


@dataclass
class Kernel:
    """One `.entry` being built: parameters, registers, shared arrays and body lines."""

    name: str
    param_types: list[tuple[str, str]]  # (name, PTX type) in launch order
    #: the architecture-specific target it needs (sm_90a for wgmma), None: any of ARCHS
    arch: str | None = None
    #: registers a thread may use at most (`.maxnreg`: more blocks fit a multiprocessor,
    #: at the cost of what ptxas keeps in flight), None: as ptxas chooses
    max_registers: int | None = None
    lines: list[str] = field(default_factory=list)
    _counts: dict = field(default_factory=dict)
    _shared: list[str] = field(default_factory=list)
    _module_lines: list[str] = field(default_factory=list)
    _labels: int = 0
    _open: int = 0

    def reg(self, type: str) -> Reg:
        """A new register of `type`."""
        if type not in _CLASS:
            raise PtxError(f"unknown register type {type!r}")
        cls = _CLASS[type]
        n = self._counts.get(cls, 0) + 1
        self._counts[cls] = n
        return Reg(f"%{_CLASS_PREFIX[cls]}{n}", type)

    def emit(self, line: str) -> None:
        """An instruction (or directive) as written, without the final semicolon."""
        self.lines.append(f"    {line};")

    def op(self, instr: str, *srcs, pred: Reg | str | None = None) -> Reg:
        """`instr dst, srcs..` into a new register of the result type; returns it."""
        dst = self.reg(_result_type(instr))
        guard = f"@{pred} " if pred is not None else ""
        self.emit(f"{guard}{instr} {', '.join(str(x) for x in (dst, *srcs))}")
        return dst

    def tree(self, instr: str, values: list[Reg]) -> Reg:
        """`instr` (add.f32, max.f32, ..) of the values, pairwise: short dependency
        chains."""
        values = list(values)
        while len(values) > 1:
            values = [self.op(instr, *values[i:i + 2]) if i + 1 < len(values) else values[i]
                      for i in range(0, len(values), 2)]
        return values[0]

    def to(self, dst: Reg, instr: str, *srcs, pred: Reg | str | None = None) -> Reg:
        """`instr dst, srcs..` into an existing register (loop variables, accumulators)."""
        guard = f"@{pred} " if pred is not None else ""
        self.emit(f"{guard}{instr} {', '.join(str(x) for x in (dst, *srcs))}")
        return dst

    def params(self) -> list[Reg]:
        """Every parameter loaded into a register (pointers as global addresses)."""
        out = []
        for name, type in self.param_types:
            r = self.op(f"ld.param.{type}", f"[{name}]")
            if type == "u64":
                r = self.op("cvta.to.global.u64", r)
            out.append(r)
        return out

    def special(self, sreg: str) -> Reg:
        """A special register (%tid.x, %ctaid.x, %ntid.x, %nctaid.x, %laneid ..)."""
        return self.op("mov.u32", sreg)

    def global_index(self) -> Reg:
        """ctaid.x * ntid.x + tid.x."""
        return self.op("mad.lo.u32", self.special("%ctaid.x"), self.special("%ntid.x"),
                       self.special("%tid.x"))

    def grid_stride(self) -> tuple[Reg, Reg]:
        """(this thread's global index, the grid's thread count): a grid-stride loop's
        start and step."""
        return (self.global_index(),
                self.op("mul.lo.u32", self.special("%nctaid.x"), self.special("%ntid.x")))

    def element(self, base: Reg, index: Reg, size: int) -> Reg:
        """The address of element `index` (u32) of `size` bytes at `base` (u64)."""
        return self.op("add.u64", base, self.op("mul.wide.u32", index, size))

    def load(self, type: str, address: Reg | str, space: str = "global") -> Reg:
        """A load from `space` (global, shared, .. ; "" for a generic address)."""
        return self.op(f"ld.{space}.{type}" if space else f"ld.{type}", f"[{address}]")

    def load_vector(self, type: str, address: Reg | str, width: int = 4,
                    space: str = "global") -> list[Reg]:
        regs = [self.reg(type) for _ in range(width)]
        instr = f"ld.{space}.v{width}.{type}" if space else f"ld.v{width}.{type}"
        self.emit(f"{instr} {{{', '.join(map(str, regs))}}}, [{address}]")
        return regs

    def store(self, type: str, address: Reg | str, value, space: str = "global") -> None:
        self.emit(f"st.{space}.{type} [{address}], {value}")

    def store_vector(self, type: str, address: Reg | str, values, space: str = "global") -> None:
        self.emit(f"st.{space}.v{len(values)}.{type} [{address}], "
                  f"{{{', '.join(map(str, values))}}}")

    def setp(self, cmp: str, a, b) -> Reg:
        """A predicate `a cmp b`, cmp as `lt.u32`, `ge.f32`, .."""
        return self.op(f"setp.{cmp}", a, b)

    def shared(self, name: str, type: str, count: int | None, align: int = 16) -> str:
        """A shared-memory array (count None: sized at launch, the dynamic shared memory);
        returns its name (its address: `mov.u32 r, name`)."""
        if count is None:  # declared at module scope, named for this kernel
            name = f"{self.name}_{name}"
            self._module_lines.append(f".extern .shared .align {align} .{type} {name}[];")
        else:
            self._shared.append(f"    .shared .align {align} .{type} {name}[{count}];")
        return name

    def wait_for_predecessors(self) -> None:
        """Wait here, not at the kernel's start, for the grid this launch depends on (a
        programmatic dependent launch): what comes before overlaps that predecessor's
        end (the grids before it have finished), so it may only read what the
        predecessor does not write (parameters, weights, a KV cache's earlier rows) and
        prefetch into L2 (a hint: no stale value is read through it)."""
        if self._open:
            raise PtxError(f"kernel {self.name}: wait_for_predecessors inside a block")
        if _WAIT_MARK in self.lines:
            raise PtxError(f"kernel {self.name}: wait_for_predecessors twice")
        self.lines.append(_WAIT_MARK)

    # ---- Hopper's bulk copies (sm_90): global memory into shared, counted by a barrier ----
    def barrier_init(self, barriers, arrivals: int = 1) -> None:
        """mbarriers (8 shared bytes at each address of `barriers`, one or a list) each
        expecting `arrivals`, made visible to the bulk copies that will complete them
        (one fence for all; every thread must pass a bar.sync before waiting on them)."""
        for barrier in barriers if isinstance(barriers, list) else [barriers]:
            self.emit(f"mbarrier.init.shared::cta.b64 [{barrier}], {arrivals}")
        self.emit("fence.mbarrier_init.release.cluster")

    def barrier_expect(self, barrier, nbytes) -> None:
        """Arrive on `barrier`, which then completes once `nbytes` more have landed."""
        self.emit(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [{barrier}], {nbytes}")

    def bulk_copy(self, to_shared, from_global, nbytes, barrier) -> None:
        """Copy `nbytes` (a multiple of 16, both addresses 16-byte aligned) from global
        to shared memory asynchronously, counted on `barrier` as they land."""
        self.emit(f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                  f"[{to_shared}], [{from_global}], {nbytes}, [{barrier}]")

    def barrier_wait(self, barrier, parity: int = 0) -> None:
        """Wait until `barrier`'s phase of `parity` has completed (at once if it has)."""
        again = self.label()
        self.place(again)
        done = self.reg("pred")
        self.emit(f"mbarrier.try_wait.parity.shared::cta.b64 {done}, [{barrier}], {parity}")
        self.branch(again, done, negate=True)

    def label(self) -> str:
        self._labels += 1
        return f"L{self._labels}"

    def place(self, label: str) -> None:
        self.lines.append(f"{label}:")

    def branch(self, label: str, pred: Reg | str | None = None, negate: bool = False) -> None:
        guard = "" if pred is None else f"@{'!' if negate else ''}{pred} "
        self.emit(f"{guard}bra.uni {label}" if pred is None else f"{guard}bra {label}")

    @contextmanager
    def if_(self, pred: Reg):
        """The block runs where `pred` holds (a branch around it elsewhere)."""
        skip = self.label()
        self.branch(skip, pred, negate=True)
        self._open += 1
        yield
        self._open -= 1
        self.place(skip)

    @contextmanager
    def loop(self, counter: Reg, end, step):
        """`for (; counter < end; counter += step)`, counter u32, compared unsigned."""
        top, done = self.label(), self.label()
        self.place(top)
        self.branch(done, self.setp("ge.u32", counter, end))
        self._open += 1
        yield
        self._open -= 1
        self.to(counter, "add.u32", counter, step)
        self.branch(top)
        self.place(done)

    def text(self, dependent_launch: bool = False) -> str:
        """The `.entry`; with `dependent_launch` (sm_90 on), it first waits for the grids
        it depends on, then lets the next launch start: a programmatic dependent launch
        (driver.py's `dependent`) overlaps a kernel's start with its predecessor's end,
        and without one both instructions do nothing."""
        if self._open:
            raise PtxError(f"kernel {self.name}: {self._open} block(s) left open")
        params = ",\n".join(f"    .param .{t} {n}" for n, t in self.param_types)
        decls = [f"    .reg .{cls} %{_CLASS_PREFIX[cls]}<{n + 1}>;"
                 for cls, n in sorted(self._counts.items())]
        # wait first (or where wait_for_predecessors put it): nothing of this kernel may
        # read its predecessor's output before
        wait = _WAIT_LINES if dependent_launch else []
        if _WAIT_MARK in self.lines:
            at = self.lines.index(_WAIT_MARK)
            lines = [*self.lines[:at], *wait, *self.lines[at + 1:]]
        else:
            lines = [*wait, *self.lines]
        body = "\n".join([*decls, *self._shared, *lines, "    ret;"])
        head = "".join(f"{line}\n" for line in self._module_lines)
        limit = f".maxnreg {self.max_registers}\n" if self.max_registers else ""
        return f"{head}.visible .entry {self.name}(\n{params}\n)\n{limit}{{\n{body}\n}}\n"


def module(kernels: list[Kernel], arch: str) -> str:
    """A PTX module of `kernels` for GPU architecture `arch` (sm_80, sm_90, ..); kernels
    of one architecture only (sm_90) need that one, and those of its own features
    (sm_90a) make it that target, on that GPU only."""
    if not arch.startswith("sm_") or not arch[3:].isdigit():
        raise PtxError(f"unknown GPU architecture {arch!r} (e.g. sm_80, sm_90)")
    target = arch
    for needed in {k.arch for k in kernels if k.arch is not None}:
        if needed.rstrip("a") != arch:
            names = ", ".join(k.name for k in kernels if k.arch == needed)
            raise PtxError(f"{names} run on {needed} only, not {arch}")
        if needed.endswith("a"):
            target = needed
    arch = target
    head = f"//\n// Generated by pxvm\n//\n.version {PTX_VERSION}\n.target {arch}\n.address_size 64\n"
    dependent = int(arch[3:].rstrip("a")) >= DEPENDENT_LAUNCH_ARCH
    return "\n".join([head, *(k.text(dependent) for k in kernels)])
