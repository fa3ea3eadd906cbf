"""A language model's dispatch plans for the browser: pxvm's own Model (pxvm.llm.model)
loaded onto a PlanDevice, its decoding steps and prompts recorded as the WebGPU backend
records them, exported as data the page executes with the same .wgsl files.

The server never needs the model's weights, only its header: the page sends the GGUF
header and the file's vectors (norm gains, biases: a few hundred KB), and the server
writes a *skeleton* of the file, every matrix row's first bytes a tag naming its tensor
and row (TAG_WORDS), the rest zeros. The Model loads from it as from the real file (its
checks, its row parts, its joined [Wq; Wk; Wv] and [Wgate; Wup]); every matrix it
uploads is raw GGUF rows, so the tags say which bytes of the file each weight buffer
holds, and the plan lists those byte ranges (by tensor name) for the page to upload from
its own copy of the file. Vectors, RoPE tables and the decoding state are small and go
as data; KV caches and intermediate results start as zeros.

The page then runs, for a prompt, the plan of `record_piece` (the prompt's tokens and
state [last token, position] written first; the last token's logits read back), and for
each next token the decoding step of `record_step` for the token's span of positions
(decode.step_bound), which writes the token it draws into the state's history, as
Decoder.run does.
"""

from __future__ import annotations

import os
import tempfile
import threading

import numpy as np

from ..backends.webgpu import WebGPUContext
from ..backends.webgpu.runtime import UNIFORM_SLOT
from ..batch import Batch
from ..core import Tensor
from ..core.errors import PxvmError
from ..llm import decode
from ..llm.generate import encode_text
from ..llm.gguf_model import GGUFModelFile
from ..llm.gguf_scan import MAX_HEADER_BYTES, scan
from ..llm.model import PROMPT_CHUNK, Model
from ..llm.tokenizer import Tokenizer
from .plans import PlanBackend, PlanBuffer, PlanDevice, b64

#: A matrix row's tag: six little-endian u16 words, each below 0x4000 so that no float16
#: scale of a quantized block (nor an F16/F32 value) that the tag overlaps is NaN or
#: infinite (the model's loader refuses those): two fixed words, then the tensor's index
#: and the row, 28 bits each.
TAG_MAGIC = (0x2A17, 0x1C3B)
TAG_BYTES = 12
_LOW = 0x3FFF
#: Positions of the KV cache the browser's model keeps (load_model's max_context): the
#: page's caches are allocated at once, and SwiftShader runs attention over long caches
#: slowly. Chats in the page stay short.
BROWSER_CONTEXT = 2048
#: The largest prompt plan: longer prompts run as pieces of it (as model.py's chunks).
MAX_PROMPT_TOKENS = PROMPT_CHUNK
#: Browser models the server keeps recorded (the most recently used).
MODELS_KEPT = 2
#: The bytes of the file's vectors a page may send (all F32 / F16 1-D tensors).
MAX_VECTOR_BYTES = 16 << 20
#: The largest file the server writes a skeleton of (its tags touch every page of it):
#: a browser holds the whole file, and its GPU the weights, so pages run smaller models.
MAX_FILE_BYTES = 4 << 30


class BrowserModelError(PxvmError):
    """A model the page asked for that cannot be planned; the message says why."""


# ---- the skeleton ------------------------------------------------------------------------
def vector_tensors(header) -> list:
    """The file's 1-D tensors in file order: the bytes the page sends after the header."""
    return sorted((t for t in header.tensors.values() if len(t.dims) == 1),
                  key=lambda t: t.offset)


def _scan_skeleton(path: str, body: bytes, file_size: int, where: str):
    """The header of a skeleton begun at `path`: the body's first bytes in a sparse file
    of the real file's size, scanned as pxvm scans a file (every bound of gguf_scan);
    (header, vectors, the vectors' bytes) after checking the body is the header and the
    file's vectors (vector_tensors) one after another."""
    if not 0 < file_size <= MAX_FILE_BYTES:
        raise BrowserModelError(f"{where}: the file has {file_size:,} bytes; the page runs "
                                f"models of 1 to {MAX_FILE_BYTES:,} bytes")
    head = body[:min(len(body), MAX_HEADER_BYTES, file_size)]
    with open(path, "wb") as f:
        f.truncate(file_size)
        f.write(head)
    header = scan(np.memmap(path, np.uint8, "r"), where)
    vectors = vector_tensors(header)
    want = header.data_offset + sum(t.n_bytes for t in vectors)
    if len(body) != want:
        raise BrowserModelError(
            f"{where}: the request holds {len(body):,} bytes, but the file's header "
            f"({header.data_offset:,} bytes) and its {len(vectors)} vectors take {want:,}")
    if sum(t.n_bytes for t in vectors) > MAX_VECTOR_BYTES:
        raise BrowserModelError(f"{where}: the file's vectors take over {MAX_VECTOR_BYTES:,} "
                                "bytes; the page runs smaller models")
    return header, vectors, body[header.data_offset:]


def _tag_rows(view: np.ndarray, index: int, rows: int, row_bytes: int) -> None:
    if row_bytes < TAG_BYTES:
        raise BrowserModelError(f"rows of {row_bytes} bytes are too short to be tagged "
                                f"({TAG_BYTES}); the page cannot plan this model")
    if index > 1 << 28 or rows > 1 << 28:
        raise BrowserModelError("too many tensors or rows to tag")
    r = np.arange(rows, dtype=np.uint32)
    words = np.empty((rows, 6), np.uint16)
    words[:, 0], words[:, 1] = TAG_MAGIC
    words[:, 2], words[:, 3] = index & _LOW, index >> 14
    words[:, 4], words[:, 5] = r & _LOW, r >> 14
    view.reshape(rows, row_bytes)[:, :TAG_BYTES] = words.view(np.uint8).reshape(rows, TAG_BYTES)


def write_skeleton(path: str, header, vectors: list, vector_bytes: bytes) -> list:
    """Fill the tensor data of the skeleton begun by _scan_skeleton (module doc): the
    vectors, every matrix row's tag, zeros elsewhere; returns tensor names by tag index."""
    mm = np.memmap(path, np.uint8, "r+")
    try:
        mm[header.data_offset:header.data_offset + len(vector_bytes)] = 0
        at = 0
        for t in vectors:
            mm[t.offset:t.offset + t.n_bytes] = np.frombuffer(vector_bytes, np.uint8, t.n_bytes, at)
            at += t.n_bytes
        for index, t in enumerate(header.tensors.values()):
            if len(t.dims) >= 2:
                rows = int(np.prod(t.dims[1:], dtype=np.int64))
                _tag_rows(mm[t.offset:t.offset + t.n_bytes], index, rows, t.n_bytes // rows)
        mm.flush()
    finally:
        del mm
    return list(header.tensors)


def weight_segments(rows: np.ndarray, names: list, tensors: dict) -> list | None:
    """[[tensor name, first byte in the tensor, bytes], ..] of a weight upload `rows` (N,
    row bytes) uint8 whose every row is tagged; None where it is not a tagged matrix."""
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] < TAG_BYTES or not rows.shape[0]:
        return None
    words = np.ascontiguousarray(rows[:, :TAG_BYTES]).view(np.uint16).astype(np.int64)
    if not ((words[:, 0] == TAG_MAGIC[0]) & (words[:, 1] == TAG_MAGIC[1])).all():
        return None
    index = words[:, 2] | words[:, 3] << 14
    row = words[:, 4] | words[:, 5] << 14
    row_bytes = rows.shape[1]
    # a segment breaks where the tensor changes or the rows stop being consecutive
    breaks = np.flatnonzero((index[1:] != index[:-1]) | (row[1:] != row[:-1] + 1)) + 1
    segments = []
    for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), rows.shape[0]]):
        name = names[int(index[a])]
        segments.append([name, int(row[a]) * row_bytes, (b - a) * row_bytes])
        if tensors[name].n_bytes < (int(row[b - 1]) + 1) * row_bytes:
            raise BrowserModelError(f"a weight's rows run past tensor {name!r}")
    return segments


# ---- recording ---------------------------------------------------------------------------
class ModelPlanDevice(PlanDevice):
    """A PlanDevice whose buffers also say what they hold: "weight" (byte ranges of the
    file), "data" (bytes given here) or "zeros"."""

    def __init__(self, features, names: list, tensors: dict, software: bool):
        super().__init__(features)
        self.names, self.tensors = names, tensors
        #: a CPU rasteriser (SwiftShader): kernels take the variants with fewer barriers,
        #: as the native backend does on one (WebGPUContext.is_software)
        self.is_software = software
        self.kinds: list[dict] = []

    def _buffer(self, nbytes: int, data: bytes | None) -> PlanBuffer:
        buf = super()._buffer(nbytes, None)
        self.kinds.append({"kind": "zeros"} if data is None else {"kind": "data", "data": b64(data)})
        return buf

    def upload(self, array: np.ndarray, what: str = "tensor") -> PlanBuffer:
        segments = weight_segments(np.asarray(array), self.names, self.tensors)
        if segments is None:
            return super().upload(array, what)
        buf = self._buffer(array.nbytes, None)
        self.kinds[-1] = {"kind": "weight", "segments": segments}
        return buf

    def zeros(self, nbytes: int) -> PlanBuffer:
        return self._buffer(max(nbytes, 4), None)

    def buffer_json(self, first: int = 0) -> list[dict]:
        return [{"nbytes": b.nbytes, "size": b.binding_size(), **kind}
                for b, kind in zip(self.buffers[first:], self.kinds[first:])]


class ModelPlanBackend(PlanBackend):
    """The backend a browser model loads onto: WebGPU's kernels recorded into one
    ModelPlanDevice, weights split at the page's binding limit."""

    records = True

    def __init__(self, device: ModelPlanDevice, max_tensor_bytes: int):
        super().__init__(device)
        self.max_tensor_bytes = max_tensor_bytes

    def identity(self) -> str:
        return "browser-plan"

    def describe(self) -> str:
        # what the model's size checks name (weights.py, model.py): the page's limit
        return (f"this browser's WebGPU (the smaller of its maxStorageBufferBindingSize "
                f"and maxBufferSize: {self.max_tensor_bytes:,} bytes)")

    def memory_bytes(self):
        return None

    def zeros(self, shape, dtype) -> Tensor:
        dtype = np.dtype(dtype)
        return Tensor(tuple(shape), dtype, self,
                      self.device.zeros(int(np.prod(shape)) * dtype.itemsize))

    def context(self, *, timestamps=False, profile=False, capture=False):
        return WebGPUContext(self, self.device, self.device, one_buffer=True)


class BrowserModel:
    """pxvm's Model of one GGUF file, recorded for the page (module doc)."""

    def __init__(self, body: bytes, file_size: int, where: str, features: tuple[str, ...],
                 max_binding: int, software: bool = False, context: int = BROWSER_CONTEXT):
        self.lock = threading.Lock()
        with tempfile.TemporaryDirectory(prefix="pxvm-browser-model-") as tmp:
            path = os.path.join(tmp, "skeleton.gguf")
            header, vectors, vector_bytes = _scan_skeleton(path, body, file_size, where)
            names = write_skeleton(path, header, vectors, vector_bytes)
            self.device = ModelPlanDevice(features, names, header.tensors, software)
            self.backend = ModelPlanBackend(self.device, max_binding)
            file = GGUFModelFile(path)
            file.path = where
            self.model = Model(file, self.backend, progress=False, max_context=context)
        self.metadata = file.metadata
        self.tokenizer = Tokenizer(file.metadata, where)
        self.steps = self._record_steps()

    def _record(self, record) -> tuple[int, int, dict]:
        start = len(self.device.dispatches)
        with Batch(self.backend):
            out = record()
        return start, len(self.device.dispatches), out

    def _record_steps(self) -> list[dict]:
        model, decoder = self.model, self.model.decoder
        bounds = sorted({decode.step_bound(p, model.context_length)
                         for p in _bound_positions(model.context_length)})
        steps = []
        for bound in bounds:
            a, b, out = self._record(lambda bound=bound: model.record_step(
                decoder.state, decoder.sampler, max_keys=bound))
            steps.append({"bound": bound, "dispatches": [a, b],
                          "logits": out["logits"].storage.index})
        return steps

    def plan(self) -> dict:
        """The model's buffers and decoding steps (the page's first answer)."""
        model, cfg = self.model, self.model.config
        return {
            "buffers": self.device.buffer_json(),
            "dispatches": self.device.dispatches,
            "uniform_size": UNIFORM_SLOT,
            "steps": self.steps,
            "state": model.decoder.state.storage.index,
            "sampler": model.decoder.sampler.storage.index,
            "state_history": decode.STATE_HISTORY,
            "steps_per_submit": decode.STEPS_PER_SUBMIT,
            "submits_in_flight": decode.SUBMITS_IN_FLIGHT,
            "context_length": model.context_length,
            "vocab_size": cfg.vocab_size,
            "max_prompt_tokens": MAX_PROMPT_TOKENS,
            "architecture": cfg.family.arch,
            "layers": cfg.n_layers,
            "kv_cache": model.kv_cache,
            "stop_ids": self.stop_ids(),
            "name": str(self.metadata.get("general.name", "")),
            "chat_template": bool(self.metadata.get("tokenizer.chat_template")),
        }

    def prompt_plan(self, tokens: int, position: int) -> dict:
        """The plan of a prompt piece of `tokens` tokens at `position` (as Model._prompt
        runs it): its own buffers (numbered from `first_buffer`, after the model's), its
        dispatches, where its tokens, its state and its last logits are."""
        model = self.model
        if not 1 <= tokens <= MAX_PROMPT_TOKENS:
            raise BrowserModelError(f"a prompt piece has 1 to {MAX_PROMPT_TOKENS} tokens, "
                                    f"not {tokens}")
        if not 0 <= position or position + tokens > model.context_length:
            raise BrowserModelError(f"{position + tokens} positions do not fit in the "
                                    f"page's context of {model.context_length}")
        device = self.device
        with self.lock:
            first = len(device.buffers)
            try:
                ids = self.backend.from_numpy(np.zeros(tokens, np.int32))
                state = self.backend.from_numpy(np.zeros(2, np.int32))
                a, b, logits = self._record(
                    lambda: model.record_piece(ids, state, position + tokens))
                return {"first_buffer": first, "buffers": device.buffer_json(first),
                        "dispatches": device.dispatches[a:b], "tokens": ids.storage.index,
                        "state": state.storage.index, "logits": logits.storage.index}
            finally:
                # the piece's buffers are its own (the page keeps them with its plan): the
                # next piece numbers its buffers from `first` again, so a page asking for
                # plan after plan grows nothing here
                del device.buffers[first:], device.kinds[first:]
                del device.dispatches[self.steps[-1]["dispatches"][1]:]

    def stop_ids(self) -> list[int]:
        return sorted(int(i) for i in self.tokenizer.stop_ids)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """The token ids of a chat's prompt, the file's template rendered (generate.py's)."""
        return encode_text(self.tokenizer, self.metadata, messages=messages)

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special=True)


def _bound_positions(context: int):
    p = 0
    while p < context:
        yield p
        p = decode.step_bound(p, context)
