"""Data layouts that one kernel writes and another reads, defined here once and passed
to both as pipeline constants."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionPartials:
    """attention_cached.wgsl's per-range partial results (its `split` writes them, its
    `combine` or matmul_quant.wgsl with ATTENTION_PARTS merges them). The keys a token
    sees are cut into `n_ranges` ranges of `range_len` keys (covering `max_keys`); for
    token i, query head h and range r the record at ((i * heads + h) * n_ranges + r) *
    `stride` floats holds `head_dim` unnormalised output sums, then the range's max
    score (at `max_at`) and its sum of exponentials relative to that max (at `sum_at`)."""

    head_dim: int
    n_ranges: int
    range_len: int
    max_keys: int

    @property
    def stride(self) -> int:
        return self.head_dim + 2

    @property
    def max_at(self) -> int:
        return self.head_dim

    @property
    def sum_at(self) -> int:
        return self.head_dim + 1

    def constants(self) -> dict[str, int]:
        """The record's layout as the kernels' PART_* pipeline constants."""
        return {"PART_STRIDE": self.stride, "PART_MAX": self.max_at, "PART_SUM": self.sum_at}
