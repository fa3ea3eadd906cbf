"""One choice of a request as the server sees it: the engine's token events turned into
text pieces (detokenized incrementally, held back while they may be the start of a stop
string, cut at the first stop string), with the logprobs of the tokens each piece
carries and the reason it finished."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..llm.engine import FinishEvent, TokenEvent
from ..llm.generate import held_back
from ..llm.tokenizer import Tokenizer

#: FinishEvent reasons as OpenAI's finish_reason ("abort": the server stopped it)
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}


@dataclass
class Piece:
    """What one event adds to a choice: text certain not to be cut, the token events it
    carries (for logprobs), and the finish reason on its last piece."""

    index: int
    text: str
    tokens: list[TokenEvent]
    finish_reason: str | None = None


@dataclass
class Choice:
    index: int
    tokenizer: Tokenizer
    stops: list[str]
    request_id: int = -1
    text: str = ""
    emitted: int = 0
    token_ids: list[int] = field(default_factory=list)
    pending: list[TokenEvent] = field(default_factory=list)
    finish_reason: str | None = None
    finish: FinishEvent | None = None
    error: str | None = None

    def __post_init__(self):
        self.decoder = self.tokenizer.stream(skip_special=True)

    @property
    def done(self) -> bool:
        """Whether the client has its last piece (its FinishEvent may still be on its way)."""
        return self.finish_reason is not None

    def take(self, event: TokenEvent | FinishEvent) -> Piece | None:
        """The piece `event` completes, or None (text held back, or a late event)."""
        if isinstance(event, FinishEvent):
            self.finish = event
            if self.done:
                return None
            self.finish_reason = FINISH_REASONS.get(event.reason, event.reason)
            self.error = event.error
            self.text += self.decoder.flush()
            if self._cut_at_stop():
                self.finish_reason = "stop"
            return self._piece(len(self.text))
        if self.done:  # generated after a stop string, before the engine heard of it
            return None
        self.token_ids.append(event.token_id)
        self.pending.append(event)
        self.text += self.decoder.push(event.token_id)
        if self._cut_at_stop():
            self.finish_reason = "stop"
            return self._piece(len(self.text))
        safe = len(self.text) - held_back(self.text, self.stops)
        return self._piece(safe) if safe > self.emitted else None

    def _cut_at_stop(self) -> bool:
        """Cut the text at the first stop string in it; whether there was one."""
        hit = min((self.text.find(s) for s in self.stops if s in self.text), default=-1)
        if hit >= 0:
            self.text = self.text[:hit]
        return hit >= 0

    def _piece(self, end: int) -> Piece:
        text = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        tokens, self.pending = self.pending, []
        return Piece(self.index, text, tokens, self.finish_reason)
