"""The request bodies of the OpenAI API routes pxvm serves, as pydantic models: fields of
the wrong type, out of range or unknown are refused (400) before anything runs. Bounds
keep every request's work finite (the body's size is bounded before it is parsed)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

#: choices (n) a request may ask for
MAX_N = 16
#: stop strings a request may give, and characters each
MAX_STOPS = 16
MAX_STOP_CHARS = 256
#: prompts in one /v1/completions request
MAX_PROMPTS = 64
#: top_logprobs (chat) and logprobs (completions) at most, as OpenAI's API
MAX_TOP_LOGPROBS = 20
MAX_SEED = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[StrictStr, list[TextPart], None] = None
    name: StrictStr | None = None
    reasoning_content: StrictStr | None = None

    def template_dict(self) -> dict:
        """The message as chat templates read it: content as one text."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out = {"role": self.role, "content": content or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        return out


class JsonSchemaFormat(_Strict):
    name: StrictStr = "response"
    description: StrictStr | None = None
    # `schema` is a BaseModel attribute, hence the alias
    json_schema: dict | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: StrictBool = False


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Stop = Union[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)],
             Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]],
                       Field(max_length=MAX_STOPS)],
             None]


class _Sampling(_Strict):
    """Fields both routes take."""

    model: StrictStr | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None   # as vLLM and llama-server
    ignore_eos: StrictBool = False                            # as vLLM and llama-server
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    stop: Stop = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=0)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class CompletionRequest(_Sampling):
    prompt: Union[StrictStr,
                  Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_PROMPTS)],
                  TokenIds,
                  Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]]
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    echo: Literal[False] = False
    response_format: ResponseFormat | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [p]
        return list(p)
