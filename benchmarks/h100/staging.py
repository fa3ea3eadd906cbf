"""The staged matrix-vector kernel without its bulk copies (its barriers complete at
once, the products read whatever shared memory holds): its arithmetic alone, for
stage_ceiling.py, stage_profile.py and stage_timeline.py. Kernels built while stripped
must be built again once restored (backends.cuda's caches)."""
from pxvm.kernels.ptx import builder, quant_blocks

_COPY_ROWS, _EXPECT = quant_blocks.Staged.copy_rows, builder.Kernel.barrier_expect


def strip_copies() -> None:
    quant_blocks.Staged.copy_rows = lambda *args, **kwargs: None
    builder.Kernel.barrier_expect = lambda self, barrier, nbytes: _EXPECT(self, barrier, 0)


def restore_copies() -> None:
    quant_blocks.Staged.copy_rows, builder.Kernel.barrier_expect = _COPY_ROWS, _EXPECT
