"""Whole-step GPU time (timestamps around one pass) of the captured decode step, with
kinds of dispatches left out: what each kind costs in place.
Usage: python step_ablation.py MODEL [POSITION]: without POSITION the step recorded for
the whole context, timed at position 640; with it, the step decoding uses there."""
import functools
import sys

from recorded_step import RecordedStep

at = int(sys.argv[2]) if len(sys.argv) > 2 else None
step = RecordedStep(sys.argv[1], for_position=at)
time_items = functools.partial(step.time, pos=640 if at is None else at)
items = step.items
lab = lambda it: it[0].label
# the LM head is the step's last product (its output is the logits)
head = [it for it in items if it[0].label == "matmul_quant.wgsl:matmul"][-1]
print(f"all: {time_items(items):.1f} us ({len(items)}) at position {at or 640}")
if at is None:
    for pos in (10, 640, 4000):
        print(f"  all at pos {pos}: {step.time(items, pos):.1f} us")
for name, keep in [("no combine", lambda it: "combine" not in lab(it)),
                   ("no split", lambda it: "split" not in lab(it)),
                   ("no attention", lambda it: "attention" not in lab(it)),
                   ("products only", lambda it: "matmul" in lab(it)),
                   ("products w/o LM head", lambda it: "matmul" in lab(it) and it is not head),
                   ("attention only", lambda it: "attention" in lab(it))]:
    sel = [it for it in items if keep(it)]
    print(f"{name}: {time_items(sel):.1f} us ({len(sel)})")
# each product shape alone, 30 chained copies
for grp in sorted({it[2] for it in items if "matmul" in lab(it)}):
    sel = [it for it in items if "matmul" in lab(it) and it[2] == grp]
    print(f"product groups {grp} x{len(sel)}: {time_items(sel):.1f} us -> {time_items(sel)/len(sel):.2f} us each")
