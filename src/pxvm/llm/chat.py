"""Chat prompts from the model file's own template (tokenizer.chat_template), rendered with
jinja2 in a sandbox as Hugging Face does."""

from __future__ import annotations

from .tokenizer import Tokenizer

# For files without a template: ChatML, which most small instruct models use.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def render_chat(metadata: dict, tokenizer: Tokenizer, messages: list[dict],
                add_generation_prompt: bool = True) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    source = metadata.get("tokenizer.chat_template") or CHATML
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    tokens = tokenizer.tokens
    bos = tokens[tokenizer.bos_id] if tokenizer.bos_id is not None else ""
    eos = tokens[tokenizer.eos_id] if tokenizer.eos_id is not None else ""
    return env.from_string(source).render(messages=messages, bos_token=bos, eos_token=eos,
                                          add_generation_prompt=add_generation_prompt)
