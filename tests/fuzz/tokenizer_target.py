"""Fuzz targets for a model file's tokenizer and chat template, run in the bounded worker
(harness.py); a module of its own so that the worker imports only pxvm."""

from __future__ import annotations

from pxvm.llm.chat import render_chat
from pxvm.llm.tokenizer import Tokenizer


def build_and_encode(metadata: dict) -> None:
    """Build the tokenizer of `metadata` and encode and decode a little text."""
    tok = Tokenizer(metadata, source="case.gguf")
    tok.decode(tok.encode("hi <|im_start|>a b\n"))


def render(template, messages: list[dict]) -> None:
    render_chat(messages, template, source="case.gguf", bos_token="<s>")
