"""A recorded decode step of a model (after a 512-token prompt), and its GPU time with
timestamps around one pass: shared by step_ablation.py, step_variants.py and
kernel_ab.py, which time the step with dispatches left out or swapped. By default the
step recorded for the whole context (valid at every position); `for_position` picks the
shorter-span step that decoding uses there (pxvm.llm.decode.step_bound). `items` are the
step's captured dispatches: (runtime Pipeline, bind group, workgroups)."""
import statistics

import numpy as np
import wgpu

from pxvm.llm.model import load_model


class RecordedStep:
    def __init__(self, path: str, for_position: int | None = None):
        self.model = m = load_model(path, backend="webgpu", progress=False)
        self.device = m.backend.device
        ids = list(np.random.default_rng(0).integers(0, m.config.vocab_size, 512))
        m.reset()
        m.forward(ids)
        at = m.context_length - 1 if for_position is None else for_position
        self.items = list(m.decoder.step(at).captured.dispatches.items)
        d = self.device.device
        U = wgpu.BufferUsage
        self._query = d.create_query_set(type="timestamp", count=2)
        self._resolve = d.create_buffer(size=16, usage=U.QUERY_RESOLVE | U.COPY_SRC)
        self._read = d.create_buffer(size=16, usage=U.MAP_READ | U.COPY_DST)

    def time(self, items, pos=640, reps=15) -> float:
        """Median GPU microseconds of `items` in one pass, the state set to `pos` before
        each run (the first 3 runs are warm-up)."""
        d = self.device.device
        spans = []
        for _ in range(reps):
            self.model.decoder.set_state(1, pos)
            enc = d.create_command_encoder()
            cpass = enc.begin_compute_pass(timestamp_writes={
                "query_set": self._query, "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1})
            for pipe, group, groups in items:
                cpass.set_pipeline(pipe.pipeline)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*groups)
            cpass.end()
            enc.resolve_query_set(self._query, 0, 2, self._resolve, 0)
            enc.copy_buffer_to_buffer(self._resolve, 0, self._read, 0, 16)
            d.queue.submit([enc.finish()])
            self._read.map_sync(wgpu.MapMode.READ)
            t = np.frombuffer(self._read.read_mapped(), np.uint64).astype(np.int64)
            self._read.unmap()
            spans.append((t[1] - t[0]) * 1e-3)
        return statistics.median(spans[3:] or spans)
