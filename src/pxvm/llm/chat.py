"""Chat prompts: a model file's own Jinja chat template rendered the way Hugging Face
renders it (sandboxed environment, trim_blocks/lstrip_blocks, `raise_exception`, `tojson`),
with ChatML as the fallback for files that carry no template."""

from __future__ import annotations

import json
from functools import lru_cache

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..runtime.errors import PxvmError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(PxvmError):
    """The chat template cannot be rendered for these messages."""


def _raise_exception(message):
    raise TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str):
    # Templates are code shipped inside downloaded files: run them sandboxed.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent,
                                                                  ensure_ascii=False)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def render_chat(messages: list[dict], template: str | None = None,
                add_generation_prompt: bool = True, bos_token: str = "",
                eos_token: str = "") -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}]), ending with the
    assistant's turn opened when `add_generation_prompt`."""
    try:
        return _compile(template or CHATML_TEMPLATE).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token)
    except TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template failed: {exc}") from exc


def chat_template_of(metadata: dict) -> str | None:
    return metadata.get("tokenizer.chat_template")
