"""The page's weight viewer (static/weights.html): the served model's tensors, and PNG
tiles of their dequantized values at each zoom level, on `pxvm pixels show`'s colour map
(pxvm.llm.weight_view), a tensor's colours spanning +-LIMIT_RMS times its weights' root
mean square.

Nothing is read from a path the request names: the model is the one `pxvm serve` was
given (else the default model), a tensor is looked up by name in its header, and the
zoom level and tile numbers are integers checked against the tensor's grid."""

from __future__ import annotations

import io
import math
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from ..core.errors import PxvmError
from ..llm.gguf_model import default_model_path
from ..llm.weight_view import (LIMIT_RMS, TILE, Matrix, ModelSource, colour_map, colours, has_values,
                               tensor_stats, tile_means, zoom_levels)
from .httpd import query_integer, query_text


class WeightRequestError(PxvmError):
    """A viewer request the server cannot answer as asked; answered 400."""


class WeightTiles:
    """The viewer's answers for the model at `path` (None: the default model), opened on
    first use; each tensor's statistics computed once."""

    def __init__(self, path: str | None = None):
        self.path = path
        self._source: ModelSource | None = None
        self._stats: dict = {}
        self._lock = threading.Lock()

    def source(self) -> ModelSource:
        with self._lock:
            if self._source is None:
                self._source = ModelSource(self.path or default_model_path())
            return self._source

    def listing(self) -> dict:
        source = self.source()
        lut = colours(np.linspace(-1, 1, 256), 1.0, colour_map())
        return {"model": Path(source.path).name, "tile": TILE,
                "colours": ["#%02x%02x%02x" % tuple(int(c) for c in rgb) for rgb in lut],
                "tensors": [{"name": m.name, "type": m.qtype, "rows": m.rows, "cols": m.k,
                             "levels": zoom_levels(m)} for m in source.matrices()]}

    def stats(self, m: Matrix) -> dict:
        with self._lock:
            cached = self._stats.get(m.name)
        if cached is None:
            s = tensor_stats(self.source(), m)
            top, rms = max(abs(s.low), abs(s.high)), math.sqrt(s.mean ** 2 + s.std ** 2)
            cached = {"min": s.low, "max": s.high, "mean": s.mean, "std": s.std,
                      "peak": s.peak, "limit": min(top, LIMIT_RMS * rms) or top or 1.0}
            with self._lock:
                self._stats[m.name] = cached
        return cached

    def tensor(self, query: dict) -> Matrix:
        name = query_text(query, "tensor")
        source = self.source()
        if name not in source.header.tensors:
            raise KeyError(f"no tensor {name!r}; /api/weights lists them")
        m = source.matrix(name)
        if not has_values(m.qtype):
            raise WeightRequestError(f"tensor {name!r} is {m.qtype}, which the viewer does "
                                     "not draw")
        return m

    def tile_png(self, query: dict) -> bytes:
        """The PNG of tile (x, y) at level z of the query's tensor."""
        m = self.tensor(query)
        levels = zoom_levels(m)
        z = query_integer(query, "z", 0, levels - 1)
        span = TILE << z
        x = query_integer(query, "x", 0, -(-m.k // span) - 1)
        y = query_integer(query, "y", 0, -(-m.rows // span) - 1)
        limit = self.stats(m)["limit"]
        pixels = colours(tile_means(self.source(), m, z, x, y), limit, colour_map())
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, "PNG", compress_level=1)
        return out.getvalue()
