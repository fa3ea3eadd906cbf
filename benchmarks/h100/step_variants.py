"""Edit the recorded decode step and time it: lanes per output column for each product
kind, each against the unedited step measured right before it (the H100's step time
drifts by a few percent over a minute). Attention's constants are compile-time
constants of its kernel file: compare them with kernel_ab.py.
Usage: python step_variants.py MODEL.gguf [POSITION] (default 100; the step decoding
uses there; benchmarks/h100/README.md)."""
import statistics
import sys

from recorded_step import RecordedStep

AT = int(sys.argv[2]) if len(sys.argv) > 2 else 100
step = RecordedStep(sys.argv[1], for_position=AT)
dev = step.device
base_items = step.items
time_items = step.time
PRODUCT = ("matmul_quant.wgsl", "matmul")
# the LM head is the step's last product (its output is the logits)
head = max(i for i, (p, _, _) in enumerate(base_items) if (p.kernel, p.entry) == PRODUCT)


def with_lanes(items, idx, lanes):
    out = list(items)
    for i in idx:
        p, gr, grp = out[i]
        consts = dict(p.constants); old = consts["LANES"]; consts["LANES"] = lanes
        pipe = dev.pipeline(p.kernel, p.entry, consts)
        rows = 256 // old * grp[0]
        out[i] = (pipe, gr, (-(-rows // (256 // lanes)), grp[1], grp[2]))
    return out


def kind(i, item):
    """The product an item is (by its place and its pipeline's constants), or None."""
    p = item[0]
    if (p.kernel, p.entry) != PRODUCT:
        return None
    c = dict(p.constants)
    if i == head:
        return "head"
    if c["EPILOGUE"] == 2:
        return "gate_up"
    if c["EPILOGUE"] == 1:
        return "wo/down"
    return "qkv"


idx = {}
for i, item in enumerate(base_items):
    if kind(i, item):
        idx.setdefault(kind(i, item), []).append(i)
# a layer's products with a residual are its output projection, then its down projection
residual = idx.pop("wo/down")
idx["wo"], idx["down"] = residual[0::2], residual[1::2]


def paired(items, pos=AT):
    pairs = [(time_items(base_items, pos, 21), time_items(items, pos, 21)) for _ in range(3)]
    b = statistics.median(p[0] for p in pairs)
    v = statistics.median(p[1] for p in pairs)
    return f"{v:.1f} us vs {b:.1f} us ({v - b:+.1f})"


for name, where in idx.items():
    for lanes in (8, 16, 32, 64, 128):
        items = with_lanes(base_items, where, lanes)
        print(f"{name} ({len(where)}) lanes {lanes}: {paired(items)}", flush=True)
