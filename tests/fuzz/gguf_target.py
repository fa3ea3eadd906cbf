"""The GGUF fuzz target, run in the bounded worker (harness.py). It is a module of its own,
apart from test_fuzz_gguf.py, so that the worker imports only pxvm and this: not
hypothesis, pytest or a conftest."""

from __future__ import annotations

import os
import tempfile

from pxvm.llm import load_model


def open_load_and_run(data: bytes) -> None:
    """Write `data` to a file, open and load it on numpy, run one forward of two tokens."""
    with tempfile.TemporaryDirectory(prefix="pxvm-fuzz-gguf-") as folder:
        path = os.path.join(folder, "case.gguf")
        with open(path, "wb") as f:
            f.write(data)
        model = load_model(path, backend="numpy", progress=False)
        vocab = model.config.vocab_size
        model.forward([1 % vocab, 2 % vocab])
