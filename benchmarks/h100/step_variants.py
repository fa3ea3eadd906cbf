"""Edit the recorded decode step and time it: lanes per output column for each product
kind, and attention's RANGE / KEY_LANES / COMBINE_WG, each against the unedited step
measured right before it (the H100's step time drifts by a few percent over a minute).
Usage: python step_variants.py MODEL.gguf (benchmarks/h100/README.md)."""
import statistics
import sys

from recorded_step import RecordedStep

step = RecordedStep(sys.argv[1])
m, dev = step.model, step.device
d = dev.device
base_items = step.items
time_items = step.time
by_pipe = step.pipeline_key


def with_lanes(items, idx, lanes):
    out = list(items)
    for i in idx:
        p, gr, grp = out[i]
        key = by_pipe[id(p)]
        consts = dict(key[2]); old = consts["LANES"]; consts["LANES"] = lanes
        pipe = dev.pipeline(key[0], key[1], consts).pipeline
        by_pipe[id(pipe)] = (key[0], key[1], tuple(sorted(consts.items())))
        rows = 256 // old * grp[0]
        out[i] = (pipe, gr, (-(-rows // (256 // lanes)), grp[1], grp[2]))
    return out

L = m.config.n_layers
idx = {k: [6 * l + j for l in range(L)] for k, j in {"qkv": 1, "wo": 4, "gate_up": 5, "down": 6}.items()}
idx["head"] = [len(base_items) - 3]


def paired(items, pos=640):
    pairs = [(time_items(base_items, pos, 21), time_items(items, pos, 21)) for _ in range(3)]
    b = statistics.median(p[0] for p in pairs)
    v = statistics.median(p[1] for p in pairs)
    return f"{v:.1f} us vs {b:.1f} us ({v - b:+.1f})"


for kind in idx:
    for lanes in (16, 32, 64, 128):
        items = with_lanes(base_items, idx[kind], lanes)
        print(f"{kind} lanes {lanes}: {paired(items)}", flush=True)

src = open("src/pxvm/kernels/attention_cached.wgsl").read()
layout = d.create_pipeline_layout(bind_group_layouts=[dev._layout("attention_cached.wgsl")])


def attention_variant(wg, rng, kl, cwg, pos):
    """The step with attention_cached.wgsl's constants changed (WG = RANGE * KEY_LANES);
    the split grid covers the ranges up to `pos`, as the recorded one covers the cache."""
    v = (src.replace("const WG: u32 = 128u;", f"const WG: u32 = {wg}u;")
         .replace("const RANGE: u32 = 32u;", f"const RANGE: u32 = {rng}u;")
         .replace("const KEY_LANES: u32 = 4u;", f"const KEY_LANES: u32 = {kl}u;")
         .replace("const COMBINE_WG: u32 = 256u;", f"const COMBINE_WG: u32 = {cwg}u;"))
    mod = d.create_shader_module(code=v)
    pipes = {e: d.create_compute_pipeline(layout=layout, compute={
        "module": mod, "entry_point": e,
        "constants": {"NEOX": 0.0, "HEAD_DIM": float(m.config.head_dim)}}) for e in ("split", "combine")}
    items = []
    for p, gr, grp in base_items:
        if p.label.endswith(":split"):
            p, grp = pipes["split"], (pos // rng + 1, grp[1], grp[2])
        elif p.label.endswith(":combine"):
            p = pipes["combine"]
        items.append((p, gr, grp))
    return items


for wg, rng, kl, cwg in ((128, 32, 4, 128), (128, 32, 4, 256), (128, 32, 4, 512),
                         (128, 16, 8, 256), (256, 32, 8, 256)):
    for pos in (640, 4000):
        if pos // rng + 1 > m.context_length // 32:
            continue
        print(f"attention WG {wg} RANGE {rng} KEY_LANES {kl} COMBINE_WG {cwg} at {pos}: "
              f"{paired(attention_variant(wg, rng, kl, cwg, pos), pos)}", flush=True)
