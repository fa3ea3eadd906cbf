"""Where the matrix-vector kernel's rows can be staged in shared memory
(pxvm.backends.cuda.ptx.quant_blocks.staging_fits, quantized.stages, staged_bytes and a ring's
threads), against the `gguf` package's block sizes, and which copies it queues after its
wait; CUDA runs of the staged kernel: tests/backends."""

from __future__ import annotations

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pxvm.backends.cuda.ptx import quant_blocks
from pxvm.backends.cuda.ptx import quantized as ptx_quantized
from pxvm.backends.cuda.ptx.builder import module



@pytest.mark.parametrize("qtype,k,fits", [
    ("Q8_0", 256, True),    # scales plane: 8 blocks of 2 bytes, one 16-byte chunk
    ("Q8_0", 96, False),    # 3 blocks: 6 bytes of scales a row
    ("Q8_0", 4096 + 32, False),
    ("Q4_K", 256, True),    # raw 144-byte super-blocks
    ("Q4_K", 11008, True),
    ("Q6_K", 512, False),   # its d plane: 2 bytes a super-block
    ("Q6_K", 2048, True),
    ("Q4_0", 64, False),
    ("F32", 32, True),      # one block of 32 floats: 128 bytes
    ("F16", 32, True),
])
def test_rows_are_staged_where_every_plane_is_whole_16_byte_chunks(qtype, k, fits):
    assert quant_blocks.staging_fits(quant_blocks.FORMATS[qtype], k) == fits


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K", "Q4_0"])
def test_a_staged_block_holds_its_rows_gguf_bytes_within_the_limit(qtype):
    block_values, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    k = 4096
    row_bytes = k // block_values * block_bytes
    assert ptx_quantized.staged_bytes(qtype, 16, k) == 16 * row_bytes
    rows_in_limit = ptx_quantized.MAX_STAGED_BYTES // row_bytes
    assert ptx_quantized.stages(qtype, rows_in_limit, k)
    assert not ptx_quantized.stages(qtype, rows_in_limit + 1, k)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_a_ring_holds_half_its_blocks_rows_at_once(qtype):
    block_values, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    k = 11008 if qtype == "Q4_K" else 4096
    row_bytes = k // block_values * block_bytes
    assert ptx_quantized.staged_bytes(qtype, 16, k, "ring") == 8 * row_bytes
    rows_in_limit = ptx_quantized.MAX_STAGED_BYTES // row_bytes
    assert ptx_quantized.stages(qtype, 2 * rows_in_limit, k, "ring")
    assert not ptx_quantized.stages(qtype, 2 * rows_in_limit + 2, k, "ring")


def test_a_ring_multiplies_its_rows_in_one_pass_of_at_most_max_ring_threads():
    # 11008 values: 344 units, in 352 threads (two passes of 192 for the other kernels)
    assert ptx_quantized.threads_for(11008, "ring") == 352
    assert ptx_quantized.threads_for(11008) == 192
    most = ptx_quantized.MAX_RING_THREADS * 32  # values a ring's row may have
    assert ptx_quantized.stages("Q4_K", 2, most, "ring")
    assert not ptx_quantized.stages("Q4_K", 2, most + 256, "ring")
    assert ptx_quantized.stages("Q4_K", 2, most + 256, "stage")


def test_a_ring_of_one_group_is_refused():
    with pytest.raises(ValueError, match="two groups"):
        ptx_quantized.matvec("Q4_K", 8, 8, "ring")
    assert ptx_quantized.matvec("Q4_K", 8, 4, "ring").name == "matvec_q4_k_r8_g4_ring"


def _copies_around_the_wait(kernel) -> tuple[int, int]:
    """(bulk copies queued before the kernel's griddepcontrol.wait, after it)."""
    lines = module([kernel], "sm_90").splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    copies = [i for i, line in enumerate(lines) if "cp.async.bulk.shared" in line]
    return sum(i < wait for i in copies), sum(i > wait for i in copies)


@pytest.mark.parametrize("qtype,rows,group,prefetch,around", [
    ("Q4_K", 16, 4, "stage", (3, 1)),   # the last of 4 groups after the wait
    ("Q6_K", 16, 4, "stage", (12, 4)),  # four planes: four copies a group
    ("Q4_K", 16, 16, "stage", (1, 0)),  # one group: before the wait
    ("Q4_0", 16, 4, "stage", (8, 0)),   # not a late type: every group before
    ("Q8_0", 16, 4, "stage", (8, 0)),
    ("Q4_K", 16, 4, "ring", (1, 3)),    # 2 groups at once, the second late; 2 refills
])
def test_late_types_queue_the_last_group_they_hold_at_once_after_the_wait(
        qtype, rows, group, prefetch, around):
    assert _copies_around_the_wait(
        ptx_quantized.matvec(qtype, rows, group, prefetch)) == around
