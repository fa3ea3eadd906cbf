"""`DispatchList`: dispatches captured once (by a CapturingRecorder) and submitted again
and again, such as a decoding step. The host cost of a submit is then only encoding
(pipeline, bind group, workgroups) per dispatch, through the device's native calls."""

from __future__ import annotations


class DispatchList:
    """Captured dispatches, with every buffer they bind (they stay valid as long as the
    list lives). Whatever changes between submits must live in buffers, written from the
    host or by the dispatches themselves: the captured parameter blocks are fixed."""

    def __init__(self, device, items: list, keep: list):
        self.device = device
        self.items = items  # (Pipeline, wgpu bind group, (x, y, z) workgroups)
        self._keep = keep
        # the items as the device's calls encode them (valid while `items` holds them)
        self.prepared = device.calls.prepare(items)

    def __len__(self) -> int:
        return len(self.items)

    def submit(self, stage: list = (), timestamps: bool = False, runs: int = 1,
               each_run: bool = True):
        """Encode and submit the dispatches, then copies of the allocations in `stage`
        for reading back; the returned (submitted) Recorder has the StagingReadback copies in
        `.staged`. With `runs` > 1 the dispatches go `runs` times into the one command
        buffer, and each StagingReadback holds a copy of its allocation after every run (after
        the last only, when not `each_run`): one submit and one readback for several
        steps. A copy between runs splits the compute pass, which slowed decoding on
        the H100 (docs/benchmarks-log.md)."""
        recorder = self.encode(stage, timestamps, runs, each_run)
        recorder.submit()
        return recorder

    def encode(self, stage: list = (), timestamps: bool = False, runs: int = 1,
               each_run: bool = True):
        """As submit, but only encoded (finished, not queued): the returned Recorder's
        submit() queues it. Safe on another thread than the submits."""
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        recorder = self.device.recorder(timestamps=timestamps)
        staged = [recorder.staging(alloc, runs if each_run else 1) for alloc in stage]
        for run in range(runs):
            recorder.replay(self)
            if each_run or run == runs - 1:
                for alloc, st in zip(stage, staged):
                    recorder.copy_to_staging(alloc, st, run if each_run else 0)
        recorder.staged = staged
        recorder.finish()
        return recorder
