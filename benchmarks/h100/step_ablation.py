"""Whole-step GPU time (timestamps around one pass) of the captured decode step, with
kinds of dispatches left out: what each kind costs in place."""
import sys, statistics, numpy as np, wgpu
from pxvm.llm.model import load_model
m = load_model(sys.argv[1], backend="gpu", progress=False)
dev = m.backend.device; d = dev.device
ids = list(np.random.default_rng(0).integers(0, m.config.vocab_size, 512))
m.reset(); m.forward(ids)
lst = m._decode_step()._list
q = d.create_query_set(type="timestamp", count=2)
U = wgpu.BufferUsage
res = d.create_buffer(size=16, usage=U.QUERY_RESOLVE | U.COPY_SRC)
rd = d.create_buffer(size=16, usage=U.MAP_READ | U.COPY_DST)
def time_items(items, pos=640, reps=15):
    ts = []
    for r in range(reps):
        m.state.write([1, pos])
        e = d.create_command_encoder()
        c = e.begin_compute_pass(timestamp_writes={"query_set": q, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        for p, g, grp in items:
            c.set_pipeline(p); c.set_bind_group(0, g); c.dispatch_workgroups(*grp)
        c.end(); e.resolve_query_set(q, 0, 2, res, 0); e.copy_buffer_to_buffer(res, 0, rd, 0, 16)
        d.queue.submit([e.finish()]); rd.map_sync(wgpu.MapMode.READ)
        t = np.frombuffer(rd.read_mapped(), np.uint64).astype(np.int64); rd.unmap()
        ts.append((t[1] - t[0]) * 1e-3)
    return statistics.median(ts[3:])
items = lst.items
lab = lambda it: it[0].label
print(f"all: {time_items(items):.1f} us ({len(items)})")
for pos in (10, 640, 4000):
    print(f"  all at pos {pos}: {time_items(items, pos):.1f} us")
for name, keep in [("no combine", lambda it: "combine" not in lab(it)),
                   ("no split", lambda it: "split" not in lab(it)),
                   ("no attention", lambda it: "attention" not in lab(it)),
                   ("products only", lambda it: "matmul" in lab(it)),
                   ("products w/o LM head", lambda it: "matmul" in lab(it) and it[2][0] < 6000),
                   ("attention only", lambda it: "attention" in lab(it))]:
    sel = [it for it in items if keep(it)]
    print(f"{name}: {time_items(sel):.1f} us ({len(sel)})")
# each product shape alone, 30 chained copies
for grp in sorted({it[2] for it in items if "matmul" in lab(it)}):
    sel = [it for it in items if "matmul" in lab(it) and it[2] == grp]
    print(f"product groups {grp} x{len(sel)}: {time_items(sel):.1f} us -> {time_items(sel)/len(sel):.2f} us each")
