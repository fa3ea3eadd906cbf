"""Ops are math: no module under pxvm.ops names a backend, a kernel language or a device,
in code, strings or comments (import-linter checks the imports; this checks the words)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

import pxvm.ops

#: words that belong to a backend's package, not to the math
BACKEND_WORDS = re.compile(
    r"\b(webgpu|wgpu|wgsl|vulkan|lavapipe|cuda|ptx|sm_\d+|hopper|h100|h200|numba|cpu)\b",
    re.IGNORECASE)


def backend_words(source: str) -> list[tuple[int, str]]:
    """(line, word) of every backend word in the source's names, strings and comments."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT,
                          getattr(tokenize, "FSTRING_MIDDLE", -1)):
            found += [(token.start[0], m.group(0)) for m in BACKEND_WORDS.finditer(token.string)]
    return found


OPS_MODULES = sorted(Path(pxvm.ops.__file__).parent.rglob("*.py"))


@pytest.mark.parametrize("path", OPS_MODULES, ids=lambda p: p.name)
def test_ops_module_names_no_backend(path):
    assert backend_words(path.read_text()) == []


@pytest.mark.parametrize("source", [
    'from ..backends.cuda import ptx\n',
    'if ctx.device.info.arch == "sm_90":\n    pass\n',
    'x = 1  # as reduce.wgsl does\n',
    'def f():\n    """Faster on the CPU."""\n',
])
def test_backend_words_are_found_in_code_strings_and_comments(source):
    assert backend_words(source)


def test_ops_package_has_modules_to_check():
    assert {"registry.py", "transformer.py", "quantized.py"} <= {p.name for p in OPS_MODULES}
