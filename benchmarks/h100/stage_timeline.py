"""Where a staged matrix-vector product's time goes when products run back to back
(issue 17): each block's thread 0 stamps %globaltimer as the block starts, once its bulk
copies are queued, once the wait for the previous product returns, as each group of
rows has landed, and once its products are summed; with its multiprocessor. The
products run as benchmarks/cuda/quantized.py's `streamed` runs them (one CUDA graph
over 256 MB of distinct weights, dependent launches), the kernel as the op chooses it
(MODE "built"), letting the next product start once the copies are queued ("early"),
or without copies ("no-copies": the barriers complete at once).

    python benchmarks/h100/stage_timeline.py [TYPE [N K [MODE ..]]]

Prints, over the products of one graph launch (two runs), the median of each product's
times measured from the end of the product before it (its last block's summed
products), and the multiprocessors' share of its blocks. The stamps cost 10-15% of the
time ("+bare" leaves them out).
"""
import importlib
import statistics
import sys
from pathlib import Path

import numpy as np

import pxvm
from pxvm.backends import get_backend
from pxvm.kernels.ptx import builder
from staging import restore_copies, strip_copies

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
from quantized import BUSY, BY_NAME, STREAM_BYTES, Timer, kernels_of, weight  # noqa: E402

ptx_quantized = importlib.import_module("pxvm.kernels.ptx.quantized")
cuda_backend = importlib.import_module("pxvm.backends.cuda")
TYPE = sys.argv[1] if len(sys.argv) > 1 else "Q4_K"
N, K = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (4096, 4096)
MODES = sys.argv[4:] or ["built", "early", "no-copies"]
#: what a MODE may add to "built", "early" or "no-copies" (e.g. "early+pad56@32x4"):
#:   +padP     a block asks for P KiB of shared memory at least (fewer blocks an SM)
#:   @RxG      the staged kernel's shape (rows, rows a group) instead of STAGED_SHAPE
#:   +split    stamped between the wait and griddepcontrol.launch_dependents, and after
#:   +carve    the kernel prefers all of an SM's shared memory (carveout 100%)
#:   +copier32 thread 32 queues the copies (thread 0 stamps)
#:   +nolate   every copy before the wait (LATE_GROUP_TYPES emptied: the kernel before it)
#:   +fence1   as +nolate, the barriers initialised under one fence
#:   +after, +half, +3of4   as +nolate, all / the second half / the last quarter of the
#:             copies queued after the wait
#:   +landed0  as +nolate, the second half queued once the first group has landed
#:   +bare     nothing stamped: the variant's time alone
RECORD = 16  # u64 a block: y, smid << 32 | ctaid, start, queued, waited, landed x8, end,
# done (its output stored), triggered ("+split": the next product let start)
START, QUEUED, WAITED, LANDED, END, DONE, TRIGGERED = 2, 3, 4, 5, 13, 14, 15
CAPACITY = 1 << 16  # records
STAGE_ROWS, WAIT, WARP_SUMS, MATVEC, SHAPE = (
    ptx_quantized._stage_rows, builder.Kernel.wait_for_predecessors,
    ptx_quantized._warp_sums, ptx_quantized.matvec, ptx_quantized.STAGED_SHAPE)
BARRIER_WAIT, WAIT_LINES = builder.Kernel.barrier_wait, builder._WAIT_LINES
LAUNCH, LATE = cuda_backend.CudaContext.launch, ptx_quantized.LATE_GROUP_TYPES
#: the modes that build the copies themselves (without LATE_GROUP_TYPES)
VARIANTS = ("+after", "+half", "+3of4", "+landed0", "+fence1")
runtime_cuda = importlib.import_module("pxvm.runtime.cuda")
ALLOW = runtime_cuda.CudaDevice._allow_shared


def carved_allow_shared(self, function, shared_bytes):
    ALLOW(self, function, shared_bytes)
    cu = runtime_cuda._driver()
    runtime_cuda._check(cu.cuFuncSetAttribute(
        function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
        100), "carveout")


state = {}  # the kernel being built: its mode, thread 0's predicate, its record


def stamp(k, slot: int, now=None) -> None:
    """Thread 0 writes the time (now, or the time read then) into its record's `slot`."""
    now = now or k.op("mov.u64", "%globaltimer")
    k.emit(f"@{state['first']} st.global.u64 [{state['record']}+{8 * slot}], {now}")


def traced_stage_rows(k, src, tid, *args, **kwargs):
    mode = state["mode"]
    copier = k.op("xor.b32", tid, 32) if "+copier32" in mode else tid
    variant = any(m in mode for m in VARIANTS)
    stage_rows = one_fence_stage_rows if variant else STAGE_ROWS
    if "+bare" in mode:
        out = stage_rows(k, src, copier, *args, **kwargs)
        if mode.startswith("early"):
            k.emit("griddepcontrol.launch_dependents")
        return out
    trace = state["trace"]
    state["first"] = first = k.setp("eq.u32", tid, 0)
    state["waits"] = 0
    started = k.op("mov.u64", "%globaltimer")
    index = k.op("atom.global.add.u32", f"[{k.op('mov.u64', hex(trace))}]", 1, pred=first)
    index = k.op("add.u32", k.op("rem.u32", index, CAPACITY), 1)  # record 0: the counter
    record = state["record"] = k.op("add.u64", k.op("mov.u64", hex(trace)),
                                    k.op("mul.wide.u32", index, 8 * RECORD))
    k.emit(f"@{first} st.global.u64 [{record}], {k.op('ld.param.u64', '[y]')}")
    place = k.op("or.b64", k.op("shl.b64", k.op("cvt.u64.u32", k.special("%smid")), 32),
                 k.op("cvt.u64.u32", k.special("%ctaid.x")))
    k.emit(f"@{first} st.global.u64 [{record}+8], {place}")
    stamp(k, START, started)
    out = stage_rows(k, src, copier, *args, **kwargs)
    stamp(k, QUEUED)
    if state["mode"].startswith("early"):
        k.emit("griddepcontrol.launch_dependents")
    return out


def one_fence_stage_rows(k, src, tid, first, count, N, groups, group, outputs, queued=None):
    """_stage_rows as it was before LATE_GROUP_TYPES (every barrier initialised before
    one fence, then every copy), or with its copies split around the wait ("+after",
    "+half", "+3of4") or the second half once the first group has landed ("+landed0")."""
    barriers = k.op("mov.u32", k.shared("landed", "b64", groups, 8))
    row_bytes = k.op("mov.u32", 0)
    for plane_bytes in src.row_bytes.values():
        k.to(row_bytes, "add.u32", row_bytes, plane_bytes)
    before = {"+after": 0, "+half": groups // 2, "+3of4": 3 * groups // 4,
              "+landed0": groups // 2}
    before = next((v for m, v in before.items() if m in state["mode"]), groups)

    def copies(groups_):
        for g in groups_:
            ptx_quantized._copy_group(k, src, g, g, barriers, first, count, N, group,
                                      outputs, row_bytes)

    copier = k.setp("eq.u32", tid, 0)
    with k.if_(copier):
        for g in range(groups):
            k.emit(f"mbarrier.init.shared::cta.b64 [{barriers}+{8 * g}], 1")
        k.emit("fence.mbarrier_init.release.cluster")
        copies(range(before))
        if "+landed0" in state["mode"]:
            BARRIER_WAIT(k, f"{barriers}+0", 0)
            copies(range(before, groups))
    if "+landed0" not in state["mode"]:
        state["later"] = (copier, lambda: copies(range(before, groups)))
    k.emit("bar.sync 0")
    return str(barriers), row_bytes


def traced_wait(k):
    WAIT(k)
    if "later" in state:  # the copies queued after the wait
        copier, queue = state.pop("later")
        with k.if_(copier):
            queue()
    if "record" in state:
        stamp(k, WAITED)
        if "+split" in state["mode"]:
            k.emit("griddepcontrol.launch_dependents")
            stamp(k, TRIGGERED)


def traced_barrier_wait(k, barrier, parity=0):
    BARRIER_WAIT(k, barrier, parity)
    if "record" in state and state["waits"] < END - LANDED:
        stamp(k, LANDED + state["waits"])
        state["waits"] += 1


def traced_warp_sums(k, *args):
    if "record" in state:
        stamp(k, END)
    return WARP_SUMS(k, *args)


def traced_matvec(*args, **kwargs):
    state.pop("record", None)  # set by this kernel's _stage_rows, if it stages
    k = MATVEC(*args, **kwargs)
    if "record" in state:
        stamp(k, DONE)
    return k


def padded_launch(self, builder_, builder_args, args, grid, block=256, shared_bytes=0):
    if builder_ is traced_matvec:
        shared_bytes = max(shared_bytes, state["pad"])
    return LAUNCH(self, builder_, builder_args, args, grid, block, shared_bytes)


def patch(mode: str) -> None:
    state["mode"] = mode
    mode, _, shape = mode.partition("@")
    state["pad"] = int(mode.split("+pad")[1].split("+")[0]) << 10 if "+pad" in mode else 0
    if shape:
        ptx_quantized.STAGED_SHAPE = tuple(map(int, shape.split("x")))
    ptx_quantized.matvec = traced_matvec
    cuda_backend.CudaContext.launch = padded_launch
    if "+split" in mode:
        builder._WAIT_LINES = WAIT_LINES[:1]
    if "+nolate" in mode or any(m in mode for m in VARIANTS):
        ptx_quantized.LATE_GROUP_TYPES = ()
    if "+carve" in mode:
        runtime_cuda.CudaDevice._allow_shared = carved_allow_shared
    ptx_quantized._stage_rows = traced_stage_rows
    ptx_quantized._warp_sums = traced_warp_sums
    builder.Kernel.wait_for_predecessors = traced_wait
    builder.Kernel.barrier_wait = traced_barrier_wait
    if mode.startswith("no-copies"):
        strip_copies()


def unpatch() -> None:
    ptx_quantized._stage_rows, ptx_quantized._warp_sums = STAGE_ROWS, WARP_SUMS
    ptx_quantized.matvec, ptx_quantized.STAGED_SHAPE = MATVEC, SHAPE
    builder.Kernel.wait_for_predecessors, builder.Kernel.barrier_wait = WAIT, BARRIER_WAIT
    restore_copies()
    cuda_backend.CudaContext.launch = LAUNCH
    builder._WAIT_LINES = WAIT_LINES
    runtime_cuda.CudaDevice._allow_shared = ALLOW
    ptx_quantized.LATE_GROUP_TYPES = LATE
    state.clear()


def timeline(records: np.ndarray) -> None:
    """The products' medians (but the first three's), each from the end of the one
    before (its last block's summed products)."""
    records = records[records[:, START] != 0].astype(np.int64)
    products = {}  # by output and run (the records are in the order the blocks started)
    for i, r in enumerate(records):
        products.setdefault((int(r[0]), 2 * i // len(records)), []).append(r)
    order = sorted((np.array(rs) for rs in products.values()), key=lambda rs: rs[:, START].min())
    rows: dict[str, list[float]] = {}
    for before, this in zip(order, order[1:]):
        end = int(before[:, END].max())
        landed = this[:, LANDED:END].max(axis=1)
        per_sm = np.bincount(this[:, 1] >> 32)

        def us(value):
            return (float(value) - end) / 1e3

        values = {"the previous product's last block stored": us(before[:, DONE].max()),
                  "first start": us(this[:, START].min()),
                  "median start": us(np.median(this[:, START])),
                  "last start": us(this[:, START].max()),
                  "last queued": us(this[:, QUEUED].max()),
                  "first waited": us(this[:, WAITED].min()),
                  "last waited": us(this[:, WAITED].max()),
                  "median landed": us(np.median(landed)), "last landed": us(landed.max()),
                  "median summed": us(np.median(this[:, END])),
                  "last summed (the period)": us(this[:, END].max()),
                  "last stored": us(this[:, DONE].max()),
                  "a block: summed - max(waited, landed)":
                      float(np.median(this[:, END] - np.maximum(this[:, WAITED], landed))) / 1e3,
                  "fewest blocks an SM": per_sm[per_sm > 0].min(),
                  "most blocks an SM": per_sm.max()}
        if this[:, TRIGGERED].any():
            values["last triggered"] = us(this[:, TRIGGERED].max())
        for name, value in values.items():
            rows.setdefault(name, []).append(float(value))
    ticks = np.diff(np.unique(records[:, START]))
    print(f"  {len(order)} products; the timer's smallest step {ticks[ticks > 0].min()} ns")
    for name, values in rows.items():
        print(f"  | {name} | {statistics.median(values[3:]):.2f} |")


backend = get_backend("cuda")
copy_bw = 2 * BUSY / Timer(backend, 10).copy(BUSY)
qtype = BY_NAME[TYPE]
rng = np.random.default_rng(0)
w = weight(rng, qtype, N, K)
tx = backend.from_numpy(rng.standard_normal((1, K)).astype(np.float32))
weights = [backend.from_numpy(w) for _ in range(-(-STREAM_BYTES // w.nbytes))]
EMPTY = np.zeros(2 * (CAPACITY + 1) * RECORD, np.uint32)  # u64 records as pairs of u32
trace_tensor = backend.from_numpy(EMPTY)
kernel = kernels_of(backend, lambda: pxvm.ops.matmul_quant(tx, weights[0], qtype=qtype, k=K))
print(f"{backend.describe()}; 512 MB copy {copy_bw / 1e9:.0f} GB/s; {TYPE} {N} x {K} by "
      f"{kernel}, {len(weights)} weights; times in us from the previous product's last end")
for mode in MODES:
    patch(mode)
    state["trace"] = trace_tensor.storage.ptr
    cuda_backend._ptx.cache_clear()
    backend._kernels.clear()
    try:
        graph = pxvm.Graph(backend, lambda: {
            f"y{i}": pxvm.ops.matmul_quant(tx, tw, qtype=qtype, k=K)
            for i, tw in enumerate(weights)})
        graph.launch("y0", runs=2, each_run=False).result()  # compiled, warm
        backend.write(trace_tensor, EMPTY)
        launch = graph.launch("y0", timestamps=True, runs=2, each_run=False)
        launch.result()
        seconds = launch.gpu_seconds / (2 * len(weights))
    finally:
        unpatch()
        cuda_backend._ptx.cache_clear()
        backend._kernels.clear()
    records = backend.to_numpy(trace_tensor).view(np.uint64).reshape(-1, RECORD)[1:]
    if "+bare" in mode:
        print(f"{mode}: {seconds * 1e6:.2f} us a product, "
              f"{w.nbytes / seconds / copy_bw:.1%} of the copy")
        continue
    print(f"\n{mode}: {seconds * 1e6:.2f} us a product, {w.nbytes / seconds / copy_bw:.1%} "
          "of the copy")
    timeline(records)
