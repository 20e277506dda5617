"""What every provider translator produces, and the interface the engine calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# The wire protocols a provider may speak natively (a provider's ``protocols:``).
PROTOCOLS = frozenset({"chat", "embeddings", "gemini", "messages", "responses"})


@dataclass(slots=True)
class Usage:
    """Token usage as the provider reported it, normalised so that records compare across
    providers: ``prompt_tokens`` counts every input token (OpenAI's count includes cached
    ones; Anthropic's ``input_tokens`` excludes cache reads and writes, which are added)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0  # reasoning included: billed as output
    total_tokens: int = 0
    # Prompt tokens the provider served from its prompt cache (part of prompt_tokens),
    # billed at the price's cached_input rate when it has one.
    cache_read_tokens: int = 0
    # Prompt tokens written to the cache (part of prompt_tokens), and the part of them
    # written for an hour (Anthropic bills 5-minute and 1-hour writes apart).
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0  # part of completion_tokens
    cost_usd: float | None = None  # the provider's own figure, when it sends one (Venice)
    cost_diem: float | None = None


class Profile(Protocol):
    """One provider's way of speaking the OpenAI-compatible API."""

    name: str
    # Whether its streams carry a usage chunk unasked (Venice) or only when
    # stream_options.include_usage asks (OpenAI).
    sends_stream_usage: bool
    # Whether every answer carries its own cost (Venice's ``cost``): such a provider's
    # model needs no price for a USD budget to be charged (``unpriced:`` in routing).
    reports_cost: bool
    # The client protocols it speaks natively (a provider's ``protocols:`` default).
    protocols: frozenset[str]
    # Where its key goes by default: "authorization" (Bearer) or another header.
    auth_header: str
    # Headers it needs that a caller may set (a caller's value is forwarded), with the
    # value sent when the caller sent none.
    default_headers: tuple[tuple[str, str], ...]

    def prepare(self, payload: dict, *, stream: bool) -> dict:
        """The chat body as this provider wants it (a new dict when anything changed, the
        same one otherwise); raises UnsupportedParameter for what it cannot take."""
        ...

    def usage(self, payload: object) -> Usage | None:
        """The usage a decoded response, or stream chunk, reports; None when it has none."""
        ...

    def error_in(self, payload: dict) -> dict[str, str | None] | None:
        """The error a 200 body or a stream chunk carries, as {"message", "type", "code"};
        None when it carries none."""
        ...

    def error_body(self, body: bytes, status: int) -> bytes:
        """The provider's error body in OpenAI's shape, its own message kept verbatim."""
        ...
