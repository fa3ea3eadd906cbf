"""Pictures of a model's weights (`pxvm pixels show`): dequantized values on a diverging
colour map, a panel per tensor and a row of panels per layer, each panel's pixel the
mean of the weights it covers (one weight per pixel where the tensor fits the panel),
with each tensor's statistics; or one tensor at full resolution, the quant blocks'
scales, or the difference between two models of the same shapes.

Tensors are read in pieces of whole rows (a GGUF file by plain reads, never mapped
whole; a pixel container tile by tile), dequantized by the gguf package, pooled and
counted as they go: what a picture costs in memory is its pieces in flight and its
panels, whatever the model's size.

A panel's colours run from -L (blue) through 0 (white) to +L (red), L four times the
root mean square of its own pixels (their largest magnitude where smaller), so that every
panel uses the whole map whatever its scale, and a few outliers do not leave the rest
pale; its label gives L.
"""

from __future__ import annotations

import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import quants
from PIL import Image, ImageDraw, ImageFont

from ..core.errors import PxvmError
from ..core.files import check_regular_file
from ..ops.quant_types import F16_SCALES, QUANT_TYPES, quant_type
from .gguf_scan import MAX_HEADER_BYTES, GGUFHeader, ModelFileError, TensorInfo, scan
from .pixel_container import Container, open_container, read_tiles

#: The diverging colour map (matplotlib's): blue below zero, white at zero, red above.
COLOUR_MAP = "RdBu_r"
#: Bytes of raw rows dequantized at once (a row more where one row is larger).
CHUNK_BYTES = 1 << 21
#: A panel's colours span +-L, L this many times the root mean square of its pixels (or
#: their largest magnitude where smaller): a few outliers would otherwise leave every
#: other pixel pale; beyond L, the map's ends. (The RMS, not the standard deviation:
#: the map is centred on zero, and norm gains sit far from it.)
LIMIT_RMS = 4.0
#: Values coloured at once (the colour map's temporaries are 32 bytes a value).
COLOUR_VALUES = 1 << 20
#: A whole-model panel's side at most, in pixels.
CELL = 128
#: Rows a vector (norm gains, biases) is drawn with.
VECTOR_HEIGHT = 8
#: Pixels of one tensor's picture at most: larger tensors are pooled to fit.
MAX_TENSOR_PIXELS = 1 << 24
MAX_TENSOR_SIDE = 1 << 14
#: Threads drawing tensors at once (each holds one piece of rows in flight).
DRAW_THREADS = 2
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


class WeightViewError(PxvmError):
    """A picture that cannot be drawn as asked; the message says why and what to do."""


# ---- reading rows ----------------------------------------------------------------------
@dataclass(frozen=True)
class Matrix:
    """A tensor seen as rows: `rows` of `k` values (GGUF's ne0), `row_bytes` each."""

    info: TensorInfo
    rows: int
    k: int
    row_bytes: int

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def qtype(self) -> str:
        return self.info.type_name


def _matrix(t: TensorInfo) -> Matrix:
    k = t.dims[0] if t.dims else 1
    rows = math.prod(t.dims[1:]) if len(t.dims) > 1 else 1
    return Matrix(t, rows, k, t.n_bytes // rows)


class ModelSource:
    """A model's tensors read in pieces of whole rows: from a GGUF file (plain reads, so
    the pages read are not kept mapped) or from a pixel container's folder."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.container: Container | None = None
        if Path(path).is_dir():
            self.container = open_container(path)
            self.header: GGUFHeader = self.container.header
            return
        check_regular_file(self.path, ".gguf model or pixel container folder", ModelFileError)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(min(size, MAX_HEADER_BYTES))
        except OSError as exc:
            raise ModelFileError(f"cannot read model file {self.path}: "
                                 f"{exc.strerror or exc}") from None
        self.header = scan(head, self.path, file_size=size)

    def matrices(self) -> list[Matrix]:
        return [_matrix(t) for t in self.header.tensors.values()]

    def matrix(self, name: str) -> Matrix:
        t = self.header.tensors.get(name)
        if t is None:
            near = ", ".join(list(self.header.tensors)[:6])
            raise WeightViewError(f"{self.path} has no tensor {name!r}; name one of its "
                                  f"tensors ({near}, ...)")
        return _matrix(t)

    def chunks(self, m: Matrix, rows: int) -> Iterator[np.ndarray]:
        """The tensor's raw rows, `rows` at a time (the last piece fewer): (n, row_bytes)."""
        step = rows * m.row_bytes
        if self.container is None:
            for at in range(0, m.info.n_bytes, step):
                yield self._read(m, at, min(step, m.info.n_bytes - at))
            return
        pending = np.empty(0, np.uint8)
        part = self.container.tensor_part(m.name)
        for _, pixels in read_tiles(self.container.folder, part):
            pending = np.concatenate([pending, pixels]) if len(pending) else pixels
            while len(pending) >= step:
                yield pending[:step].reshape(-1, m.row_bytes)
                pending = pending[step:]
        if len(pending):
            yield pending.reshape(-1, m.row_bytes)


    def row_range(self, m: Matrix, first: int, count: int) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, raw rows) of the tensor's rows first .. first + count - 1, in pieces
        (a pixel container's tiles before them are read and passed over)."""
        step = rows_per_chunk(m)
        if self.container is None:
            for at in range(first, first + count, step):
                n = min(step, first + count - at)
                yield at, self._read(m, at * m.row_bytes, n * m.row_bytes)
            return
        row = 0
        for raw in self.chunks(m, step):
            lo, hi = max(first - row, 0), min(first + count - row, len(raw))
            if lo < hi:
                yield row + lo, raw[lo:hi]
            row += len(raw)
            if row >= first + count:
                return

    def _read(self, m: Matrix, at: int, n: int) -> np.ndarray:
        """n bytes of the tensor's data from byte `at`, as its rows."""
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), n, m.info.offset + at)
        if len(data) != n:
            raise ModelFileError(f"{self.path} ended while reading tensor {m.name!r}; it is "
                                 "truncated: download it again")
        return np.frombuffer(data, np.uint8).reshape(-1, m.row_bytes)


def rows_per_chunk(m: Matrix) -> int:
    return max(1, CHUNK_BYTES // max(1, m.row_bytes))


# ---- what is drawn ---------------------------------------------------------------------
def has_values(qtype: str) -> bool:
    """Whether tensors of type `qtype` are drawn: the types pxvm reads."""
    return qtype in QUANT_TYPES


def values(raw: np.ndarray, m: Matrix) -> np.ndarray:
    """(n, k) float32 of raw rows (n, row_bytes), dequantized by the gguf package."""
    return np.asarray(quants.dequantize(raw, quant_type(m.qtype).ggml),
                      np.float32).reshape(len(raw), m.k)


def scales(raw: np.ndarray, m: Matrix) -> np.ndarray:
    """(n, blocks a row) float32: each quant block's float16 scale d."""
    t = quant_type(m.qtype)
    offset, _ = F16_SCALES[t.ggml]
    blocks = raw.reshape(len(raw), -1, t.block_bytes)
    return blocks[:, :, offset:offset + 2].copy().view("<f2")[..., 0].astype(np.float32)


def has_scales(qtype: str) -> bool:
    return qtype in QUANT_TYPES and QUANT_TYPES[qtype].ggml in F16_SCALES


def columns(m: Matrix, of_scales: bool) -> int:
    """Values a row has in the picture: its weights, or its blocks' scales."""
    return m.k // quant_type(m.qtype).block_values if of_scales else m.k


# ---- panels ----------------------------------------------------------------------------
@dataclass
class Stats:
    """A tensor's values, counted as they stream: range, mean, spread, and the farthest
    value from the mean in standard deviations (how far its outliers reach)."""

    count: int = 0
    low: float = math.inf
    high: float = -math.inf
    total: float = 0.0
    squares: float = 0.0

    def add(self, v: np.ndarray) -> None:
        flat = v.reshape(-1)
        self.count += flat.size
        self.low = min(self.low, float(flat.min()))
        self.high = max(self.high, float(flat.max()))
        self.total += float(flat.sum(dtype=np.float64))
        self.squares += float(np.dot(flat, flat))

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(max(self.squares / self.count - self.mean ** 2, 0.0)) if self.count else 0.0

    @property
    def peak(self) -> float:
        """max |value - mean| / std: 3 to 5 for Gaussian-like weights, more with outliers."""
        spread = self.std
        return max(self.high - self.mean, self.mean - self.low) / spread if spread else 0.0

    def line(self) -> str:
        return (f"[{self.low:.3g}, {self.high:.3g}] mean {self.mean:.3g} std {self.std:.3g} "
                f"peak {self.peak:.1f} std")


@dataclass
class Panel:
    """A tensor pooled to `height` x `width` pixels as its rows stream in: each pixel the
    mean of the values whose row r and column c fall in it (r * height // rows,
    c * width // cols)."""

    name: str
    qtype: str
    rows: int
    cols: int
    height: int
    width: int
    stats: Stats = field(default_factory=Stats)
    note: str = ""   # why nothing is drawn ("" when the panel has values)

    def __post_init__(self):
        self.sums = np.zeros((self.height, self.width), np.float64)
        # first column of each pixel column, for np.add.reduceat
        self._col_starts = np.searchsorted(np.arange(self.cols) * self.width // self.cols,
                                           np.arange(self.width))

    def add(self, first_row: int, v: np.ndarray) -> None:
        self.stats.add(v)
        pooled = np.add.reduceat(v, self._col_starts, axis=1, dtype=np.float64)
        bins = (np.arange(first_row, first_row + len(v)) * self.height) // self.rows
        np.add.at(self.sums, bins, pooled)

    def means(self) -> np.ndarray:
        rows = np.bincount(np.arange(self.rows) * self.height // self.rows,
                           minlength=self.height)
        cols = np.bincount(np.arange(self.cols) * self.width // self.cols, minlength=self.width)
        means = self.sums / rows[:, None]
        means /= cols  # (in place: a tensor's picture is up to MAX_TENSOR_PIXELS values)
        return means


def _panel(m: Matrix, of_scales: bool, max_height: int, max_width: int) -> Panel:
    cols = columns(m, of_scales)
    return Panel(m.name, m.qtype, m.rows, cols, min(m.rows, max_height), min(cols, max_width))


def fill(panel: Panel, m: Matrix, source: ModelSource, of_scales: bool = False,
         other: ModelSource | None = None, progress: Callable[[int], None] | None = None) -> Panel:
    """Stream the tensor's rows (minus `other`'s same tensor's) into `panel`."""
    reader = scales if of_scales else values
    if of_scales and not has_scales(m.qtype):
        panel.note = f"{m.qtype}: no block scales"
        return panel
    if not has_values(m.qtype):
        panel.note = f"{m.qtype}: not drawn"
        return panel
    step = rows_per_chunk(m)
    theirs = _other_chunks(m, source, other, of_scales, step)
    row = 0
    for raw in source.chunks(m, step):
        v = reader(raw, m)
        if theirs is not None:
            other_raw, other_m = next(theirs)
            v = v - reader(other_raw, other_m)
        panel.add(row, v)
        row += len(raw)
        if progress is not None:
            progress(raw.nbytes)
    return panel


def _other_chunks(m: Matrix, source: ModelSource, other: ModelSource | None,
                  of_scales: bool, step: int):
    """`other`'s tensor of m's name in pieces of `step` rows, checked to be of m's shape."""
    if other is None:
        return None
    theirs = other.matrix(m.name)
    if (theirs.rows, theirs.k) != (m.rows, m.k):
        raise WeightViewError(f"tensor {m.name!r} is {m.rows:,} x {m.k:,} in {source.path} "
                              f"but {theirs.rows:,} x {theirs.k:,} in {other.path}; --diff "
                              "compares models of the same shapes")
    if of_scales and not has_scales(theirs.qtype):
        raise WeightViewError(f"tensor {m.name!r} is {theirs.qtype} in {other.path}: it has "
                              "no block scales to compare; leave out --scales")
    return ((raw, theirs) for raw in other.chunks(theirs, step))


# ---- colours and layout ----------------------------------------------------------------
def colour_map():
    """matplotlib's diverging map; WeightViewError when matplotlib is not installed."""
    try:
        from matplotlib import colormaps
    except ImportError:
        raise WeightViewError("pxvm pixels show draws with matplotlib's colour maps: "
                              "pip install matplotlib (or pip install 'pxvm[plots]')") from None
    return colormaps[COLOUR_MAP]


def panel_limit(means: np.ndarray) -> float:
    """L, the magnitude drawn at either end of the map: LIMIT_RMS times the root mean
    square of the panel's pixels, or their largest magnitude where that is smaller."""
    if not means.size:
        return 1.0
    flat = means.reshape(-1)  # max |x| and the sum of squares without a temporary array
    top = max(float(flat.max()), -float(flat.min()))
    spread = LIMIT_RMS * math.sqrt(float(np.dot(flat, flat)) / flat.size)
    limit = min(top, spread) or top
    return limit if limit > 0 and math.isfinite(limit) else 1.0


def colours(means: np.ndarray, limit: float, cmap) -> np.ndarray:
    """(h, w, 3) uint8: each mean's colour, -limit..limit onto the whole map; a few rows
    at a time (the map makes 32 bytes a value on the way)."""
    means = np.asarray(means, np.float64)
    out = np.empty(means.shape + (3,), np.uint8)
    step = max(1, COLOUR_VALUES // max(1, means.shape[-1]))
    for first in range(0, len(means), step):
        position = 0.5 + 0.5 * means[first:first + step] / limit
        out[first:first + step] = cmap(np.clip(position, 0.0, 1.0), bytes=True)[..., :3]
    return out


@dataclass
class Picture:
    """A drawn picture: the image, where each tensor's pixels are in it (x, y, width,
    height) with the limit L its colours span, and each tensor's statistics."""

    image: Image.Image
    boxes: dict = field(default_factory=dict)      # name -> (x, y, w, h)
    limits: dict = field(default_factory=dict)     # name -> L
    panels: dict = field(default_factory=dict)     # name -> Panel


_FONT_SIZE = 10
_LINE = 12
_MARGIN = 8
_COLUMN = 176   # a whole-model column: a panel and its three lines of text


def _font():
    return ImageFont.load_default(size=_FONT_SIZE)


def _legend(draw: ImageDraw.ImageDraw, cmap, x: int, y: int, what: str) -> None:
    """A colour bar from -L to +L with what L is."""
    bar = cmap(np.linspace(0, 1, 256), bytes=True)[:, :3]
    for i, colour in enumerate(bar):
        draw.line([(x + i, y), (x + i, y + 9)], fill=tuple(int(c) for c in colour))
    font = _font()
    draw.text((x, y + 11), "-L", fill="black", font=font)
    draw.text((x + 124, y + 11), "0", fill="black", font=font)
    draw.text((x + 244, y + 11), "+L", fill="black", font=font)
    draw.text((x + 270, y), what, fill="black", font=font)


def _blank(width: int, height: int) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (width, height), "white")
    return image, ImageDraw.Draw(image)


def _paste(picture: Picture, panel: Panel, cmap, x: int, y: int, vector_height: int) -> None:
    means = panel.means()
    limit = panel_limit(means)
    pixels = colours(means, limit, cmap)
    if panel.rows == 1 and vector_height > 1:
        pixels = np.repeat(pixels, vector_height, axis=0)
    picture.image.paste(Image.fromarray(np.ascontiguousarray(pixels), "RGB"), (x, y))
    picture.boxes[panel.name] = (x, y, pixels.shape[1], pixels.shape[0])
    picture.limits[panel.name] = limit


def _label(m: Matrix) -> str:
    layer = _LAYER.match(m.name)
    return layer.group(2) if layer else m.name


def _groups(matrices: list[Matrix]) -> list[tuple[str, list[Matrix]]]:
    """The model's tensors by layer: the others first ("model"), then blk.0, blk.1, ..."""
    groups: dict = {}
    for m in matrices:
        layer = _LAYER.match(m.name)
        key = int(layer.group(1)) if layer else -1
        groups.setdefault(key, []).append(m)
    return [("model" if key < 0 else f"layer {key}", groups[key]) for key in sorted(groups)]


# ---- the pictures ----------------------------------------------------------------------
def draw_model(source: ModelSource, of_scales: bool = False, other: ModelSource | None = None,
               progress: Callable[[int], None] | None = None) -> Picture:
    """The whole model: a row of panels per layer, each tensor pooled to CELL x CELL
    pixels at most (vectors VECTOR_HEIGHT rows high), labelled with its statistics."""
    cmap = colour_map()
    matrices = source.matrices()
    panels = {m.name: _panel(m, of_scales, CELL, CELL) for m in matrices}
    with ThreadPoolExecutor(max_workers=min(DRAW_THREADS, os.cpu_count() or 1)) as pool:
        for _ in pool.map(lambda m: fill(panels[m.name], m, source, of_scales, other, progress),
                          matrices):
            pass
    groups = _groups(matrices)
    widest = max(len(ms) for _, ms in groups)
    row_height = CELL + 4 * _LINE + _MARGIN
    top = 3 * _LINE + _MARGIN
    width = _MARGIN * 2 + 56 + widest * _COLUMN
    image, draw = _blank(width, top + len(groups) * row_height + _MARGIN)
    picture = Picture(image)
    font = _font()
    what = ("block scales" if of_scales else "weights") + (
        f", minus {Path(other.path).name}'s" if other else "")
    draw.text((_MARGIN, _MARGIN), f"{Path(source.path).name}: {len(matrices)} tensors' "
              f"{what}; a pixel is the mean of the values it covers", fill="black", font=font)
    _legend(draw, cmap, _MARGIN, _MARGIN + _LINE + 2, "L: 4x the RMS of each panel's pixels "
            "(given under it); beyond, the ends")
    for g, (name, ms) in enumerate(groups):
        y = top + g * row_height
        draw.text((_MARGIN, y), name, fill="black", font=font)
        for i, m in enumerate(ms):
            x = _MARGIN + 56 + i * _COLUMN
            panel = panels[m.name]
            picture.panels[m.name] = panel
            if not panel.note:
                _paste(picture, panel, cmap, x, y, VECTOR_HEIGHT)
            lines = [_label(m)[:28], f"{m.qtype} {m.rows:,}x{m.k:,}",
                     panel.note or f"L {picture.limits[m.name]:.3g} std {panel.stats.std:.3g}",
                     "" if panel.note else f"[{panel.stats.low:.3g}, {panel.stats.high:.3g}] "
                     f"peak {panel.stats.peak:.1f} std"]
            height = (VECTOR_HEIGHT if m.rows == 1 else panel.height) if not panel.note else 0
            for j, text in enumerate(lines):
                draw.text((x, y + height + 2 + j * _LINE), text, fill="black", font=font)
    return picture


def draw_tensor(source: ModelSource, name: str, of_scales: bool = False,
                other: ModelSource | None = None,
                progress: Callable[[int], None] | None = None) -> Picture:
    """One tensor at full resolution (a pixel a weight, or a block's scale), pooled only
    where it has more than MAX_TENSOR_PIXELS, with its statistics and the legend."""
    cmap = colour_map()
    m = source.matrix(name)
    if of_scales and not has_scales(m.qtype):
        raise WeightViewError(f"tensor {name!r} is {m.qtype}: it has no quant blocks, so no "
                              "scales; leave out --scales")
    if not has_values(m.qtype):
        raise WeightViewError(f"tensor {name!r} is {m.qtype}, which the gguf package does "
                              "not dequantize; pick another tensor")
    cols = columns(m, of_scales)
    width = min(cols, MAX_TENSOR_SIDE)
    height = min(m.rows, MAX_TENSOR_SIDE, max(1, MAX_TENSOR_PIXELS // width))
    panel = fill(Panel(m.name, m.qtype, m.rows, cols, height, width), m, source, of_scales,
                 other, progress)
    top = 4 * _LINE + _MARGIN
    vector = VECTOR_HEIGHT if m.rows == 1 else 1
    image, draw = _blank(max(width + 2 * _MARGIN, 560), top + height * vector + _MARGIN)
    picture = Picture(image, panels={m.name: panel})
    font = _font()
    pooled = "" if (height, width) == (m.rows, cols) else (
        f", pooled to {height:,} x {width:,} (a pixel the mean of the values it covers)")
    what = "block scales" if of_scales else "weights"
    if other is not None:
        what += f" minus {Path(other.path).name}'s"
    draw.text((_MARGIN, _MARGIN), f"{name} ({m.qtype}, {m.rows:,} x {cols:,} {what}{pooled})",
              fill="black", font=font)
    draw.text((_MARGIN, _MARGIN + _LINE), panel.stats.line(), fill="black", font=font)
    _paste(picture, panel, cmap, _MARGIN, top, vector)
    _legend(draw, cmap, _MARGIN, _MARGIN + 2 * _LINE + 2,
            f"L = {picture.limits[name]:.4g} (4x the pixels' RMS; beyond, the ends)")
    return picture


def byte_total(source: ModelSource, name: str | None = None) -> int:
    """The bytes a picture reads: one tensor's, or all of them."""
    if name is not None:
        return source.matrix(name).info.n_bytes
    return sum(t.n_bytes for t in source.header.tensors.values())


# ---- the browser viewer's tiles --------------------------------------------------------
#: A viewer tile's side, in pixels.
TILE = 256


def zoom_levels(m: Matrix) -> int:
    """Zoom levels of a tensor in the viewer: level z pools 2^z x 2^z weights a pixel;
    the last level fits the whole tensor in one tile."""
    side = max(m.rows, m.k)
    return max(1, math.ceil(math.log2(side / TILE)) + 1) if side > TILE else 1


def tile_means(source: ModelSource, m: Matrix, z: int, x: int, y: int) -> np.ndarray:
    """The viewer's tile (x, y) at level z: up to TILE x TILE pixels, each the mean of the
    2^z x 2^z weights it covers (fewer at the tensor's edges)."""
    f = 1 << z
    r0, c0 = y * TILE * f, x * TILE * f
    r1, c1 = min(m.rows, r0 + TILE * f), min(m.k, c0 + TILE * f)
    if not (0 <= r0 < r1 and 0 <= c0 < c1):
        raise WeightViewError(f"tile ({x}, {y}) at level {z} is outside tensor {m.name!r}")
    starts = np.arange(c0, c1, f) - c0
    sums = np.zeros((-(-(r1 - r0) // f), len(starts)), np.float64)
    for first, raw in source.row_range(m, r0, r1 - r0):
        pooled = np.add.reduceat(values(raw, m)[:, c0:c1], starts, axis=1, dtype=np.float64)
        np.add.at(sums, (np.arange(first, first + len(raw)) - r0) // f, pooled)
    rows = np.bincount((np.arange(r0, r1) - r0) // f, minlength=sums.shape[0])
    cols = np.diff(np.append(starts, c1 - c0))
    return sums / np.outer(rows, cols)


def tensor_stats(source: ModelSource, m: Matrix) -> Stats:
    """A tensor's statistics, from one pass over its rows."""
    return fill(Panel(m.name, m.qtype, m.rows, m.k, 1, 1), m, source).stats
