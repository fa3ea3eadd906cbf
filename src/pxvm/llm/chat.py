"""Chat prompts: a model file's own Jinja chat template rendered the way Hugging Face
transformers' `apply_chat_template` renders it, with ChatML as the fallback for files that
carry no template.

What a template can use is what transformers gives it: a sandboxed environment with
trim_blocks/lstrip_blocks and loop controls (`{% break %}`), `raise_exception(msg)` (Gemma,
Mistral), `strftime_now(fmt)` (Llama 3.1+ builds its "Today Date" with it), a `tojson` filter
that keeps non-ASCII text and takes `indent`/`separators`/`sort_keys` (Qwen's tool lists),
`{% generation %}` blocks (rendered as their body), `namespace(...)` and `dict(...)`; and the
variables `messages`, `tools` and `documents` (None when not given), `add_generation_prompt`,
the special token texts (`bos_token`, `eos_token`, ...) and any extra keyword such as
`enable_thinking` (Qwen3) or `date_string` (Llama 3)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.utils import Namespace

from ..core.errors import PxvmError, shortened
from .template_sandbox import (MAX_WIDTH, BoundedSandbox, TemplateBoundError, bounded_join,
                               render_bounded, within)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Names a message's reasoning may come under; templates read `reasoning_content`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(PxvmError):
    """The chat template cannot be rendered for these messages."""


class _TemplateRaised(TemplateError):
    """raise_exception(msg) called by the template: it refuses these messages."""


def _raise_exception(message):
    raise _TemplateRaised(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON. Made
    # piece by piece, so that its size (each item may take a line of indents) is bounded
    # as it grows.
    pad = len(indent) if isinstance(indent, str) else indent
    if isinstance(pad, int) and pad > MAX_WIDTH:
        raise TemplateBoundError(f"tojson's indent {pad:,} is over the bound of {MAX_WIDTH:,}")
    within(value)
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent,
                               separators=separators, sort_keys=sort_keys)
    return bounded_join(encoder.iterencode(value), "tojson")


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates, without handing them the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """`namespace(...)` that refuses underscore names (a way around the sandbox otherwise)."""

    def __init__(*args, **kwargs):  # Jinja's Namespace signature: `self` may be a key too
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"chat templates cannot set the attribute {name!r}")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks the assistant's text for training
    masks in transformers): rendered as its body."""

    tags = frozenset({"generation"})

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@lru_cache(maxsize=8)
def _compile(template: str):
    # Templates are code shipped inside downloaded files: run them sandboxed.
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                         extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(template)


def _plain(messages: list[dict]) -> list[dict]:
    """Copies of the messages, with `reasoning_content` filled from the other names for it."""
    out = []
    for message in messages:
        message = dict(message)
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_chat(messages: list[dict], template: str | None = None,
                add_generation_prompt: bool = True, bos_token: str = "",
                eos_token: str = "", tools: list[dict] | None = None,
                documents: list[dict] | None = None, source: str | None = None,
                **extra) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]), ending with the
    assistant's turn opened when `add_generation_prompt`. `extra` reaches the template as
    variables (other special tokens such as `unk_token`, `enable_thinking`, `date_string`).
    `source` names the model file in errors. The template runs sandboxed and bounded
    (template_sandbox.py); whatever goes wrong in it is one ChatTemplateError."""
    where = f"the chat template of {source or 'the model file'}"
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"{where} (tokenizer.chat_template) is not text but "
                                f"{type(template).__name__}; use another model file")
    try:
        return render_bounded(_compile(template or CHATML_TEMPLATE),
                              messages=_plain(messages), tools=tools, documents=documents,
                              add_generation_prompt=add_generation_prompt,
                              bos_token=bos_token, eos_token=eos_token, **extra)
    except _TemplateRaised as exc:  # the template's own refusal of these messages
        raise ChatTemplateError(f"{where} refused the messages: "
                                f"{shortened(str(exc), 300)}") from exc
    except Exception as exc:
        detail = str(exc) if isinstance(exc, TemplateError) else f"{type(exc).__name__}: {exc}"
        raise ChatTemplateError(
            f"{where} failed: {shortened(detail, 300)}; the template is code inside the "
            "model file: use another model file") from exc


def chat_template_of(metadata: dict) -> str | None:
    return metadata.get("tokenizer.chat_template")


def special_token_texts(metadata: dict) -> dict:
    """`bos_token`, `eos_token`, `unk_token`, `pad_token`: the texts of the file's special
    tokens, as transformers hands them to a chat template ('' where the file has none)."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    out = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        idx = metadata.get(f"tokenizer.ggml.{key}")
        valid = isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(tokens)
        out[name] = tokens[idx] if valid else ""
    return out
