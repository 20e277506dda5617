"""What Anthropic's Messages API and OpenAI's Responses API decide alike in the fake, so a test
can predict a reply the same way through either: which tool a turn calls (:func:`tool_to_call`)
and what of the reply -- thinking, then a tool call or the text chunks -- fits the request's
output-token cap (:func:`fit_reply`). Each API's module renders the outcome in its own wire
format."""

from collections.abc import Collection
from dataclasses import dataclass

from llm_gateway.testing.fake_content import (
    THINKING_TOKENS,
    TOOL_CALL_HEADER,
    TOOL_CALL_TOKENS,
    WORDS_PER_CHUNK,
)


def tool_to_call(
    tools: Collection[str], headers: dict[str, str], *, forbidden: bool, named: object,
    forced: bool, answering: bool, kinds: str = "tool",
) -> str | ValueError | None:
    """The tool the reply calls, or None for a text reply; a ValueError when
    :data:`TOOL_CALL_HEADER` names none of ``tools`` (the request's tools the fake can call,
    ``kinds`` saying which in the message).

    ``tool_choice`` comes first: ``forbidden`` (none) never calls one, a ``named`` tool of the
    request is called, ``forced`` (any, required) calls the header's tool or else the first.
    Otherwise the header's tool is called, unless the turn is ``answering`` a tool's result: an
    agent's loop must come to an end."""
    asked = headers.get(TOOL_CALL_HEADER)
    if asked is not None and asked not in tools:
        return ValueError(f"{TOOL_CALL_HEADER} names no {kinds} of the request: {asked!r}")
    if forbidden:
        return None
    if named in tools:
        return str(named)
    if forced and tools:
        return asked or next(iter(tools))
    return None if asked is None or answering else asked


@dataclass(frozen=True)
class FittedReply:
    """What of a reply the cap leaves, in the order it comes: thinking, then the tool call or
    ``chunks`` text chunks; ``cut`` when the cap left something out."""

    thinks: bool
    calls_tool: bool
    chunks: int
    cut: bool

    @property
    def thinking_tokens(self) -> int:
        return THINKING_TOKENS if self.thinks else 0

    @property
    def output_tokens(self) -> int:
        return (self.thinking_tokens + (TOOL_CALL_TOKENS if self.calls_tool else 0)
                + self.chunks * WORDS_PER_CHUNK)


def fit_reply(budget: int, *, thinks: bool, calls_tool: bool, chunk_count: int) -> FittedReply:
    """What fits ``budget`` output tokens of a reply that ``thinks`` first, then ``calls_tool``
    or answers ``chunk_count`` chunks: as a real model stops mid-reply, a part that does not
    fit is left out with all that would follow it, and text is cut to whole chunks."""
    if thinks:
        if budget < THINKING_TOKENS:
            return FittedReply(False, False, 0, True)
        budget -= THINKING_TOKENS
    if calls_tool:
        fits = budget >= TOOL_CALL_TOKENS
        return FittedReply(thinks, fits, 0, not fits)
    chunks = min(chunk_count, budget // WORDS_PER_CHUNK)
    return FittedReply(thinks, False, chunks, chunks < chunk_count)
