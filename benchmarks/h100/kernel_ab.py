"""Time the recorded decode step with one kernel file replaced by variant texts, each
against the unedited step measured in alternation (three pairs of 21 runs, medians), at
positions 64, 640 and 4,000 (the whole-context step) or those given with --at (the step
decoding uses at the last of them, so all must share its key bound). The variants keep
the file's bindings and entry points.
Usage: python kernel_ab.py MODEL.gguf KERNEL.wgsl VARIANT.wgsl [..] [--at 0,64,128,255]
(KERNEL is a name in src/pxvm/kernels; benchmarks/h100/README.md)."""
import argparse
import dataclasses
import statistics

from recorded_step import RecordedStep

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("kernel")
parser.add_argument("variants", nargs="+")
parser.add_argument("--at", default=None, help="comma-separated positions")
args = parser.parse_args()
model, kernel, variants = args.model, args.kernel, args.variants
positions = [int(p) for p in args.at.split(",")] if args.at else [64, 640, 4000]
step = RecordedStep(model, for_position=max(positions) if args.at else None)
dev = step.device
d = dev.device
layout = d.create_pipeline_layout(bind_group_layouts=[dev.bind_group_layout(kernel)])


def swapped(text):
    """The step's items with the kernel's pipelines compiled from `text` (same entry
    points and constants, same bind group layout, so the bind groups still fit)."""
    module = d.create_shader_module(code=text)
    built, items = {}, []
    for pipe, group, groups in step.items:
        if pipe.kernel == kernel:
            key = (pipe.entry, pipe.constants)
            if key not in built:
                built[key] = dataclasses.replace(pipe, pipeline=d.create_compute_pipeline(
                    layout=layout, compute={"module": module, "entry_point": pipe.entry,
                                            "constants": {k: float(v) for k, v in pipe.constants}}))
            pipe = built[key]
        items.append((pipe, group, groups))
    return items


for path in variants:
    items = swapped(open(path).read())
    for pos in positions:
        pairs = [(step.time(step.items, pos, 21), step.time(items, pos, 21)) for _ in range(3)]
        base = statistics.median(p[0] for p in pairs)
        var = statistics.median(p[1] for p in pairs)
        print(f"{path} at {pos}: {var:.1f} us vs {base:.1f} us ({var - base:+.1f})", flush=True)
