"""Token estimates, for when the gateway must guess before (or without) the provider's
count: about four characters of English text per token (OpenAI's rule of thumb), plus a
few tokens of framing per message. Rough on purpose: used for context-window checks,
budget reservations, the output cap a stream is held to while it is relayed and, flagged as
estimated, for usage a provider never reported."""

from __future__ import annotations

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def estimate_text(text: str) -> int:
    return estimate_chars(len(text))


def estimate_chars(chars: int) -> int:
    """Tokens in ``chars`` characters of text."""
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_prompt(payload: dict) -> int:
    """A chat body's messages (text parts), or an embeddings body's input."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        return estimate_messages(messages)
    return estimate_input(payload.get("input"))


def estimate_messages(messages: list) -> int:
    """Chat messages: each one's framing and its text (a string, or text parts)."""
    total = 0
    for message in messages:
        total += TOKENS_PER_MESSAGE
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += estimate_text(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += estimate_text(part["text"])
    return total


def estimate_input(given: object) -> int:
    """An embeddings body's input: a string, strings, or token ids (one token each)."""
    if isinstance(given, str):
        return estimate_text(given)
    if isinstance(given, list):
        return sum(estimate_text(item) if isinstance(item, str) else len(item)
                   if isinstance(item, list) else 1 for item in given)
    return 0


# The output cap's tolerance. While a stream is relayed its output is counted (estimated as
# above: providers report usage at the end, if at all) and the gateway ends it itself once
# the count passes the request's cap by a quarter and 32 tokens. The slack is for the
# estimate: text whose tokens run longer than four characters (code, long words) is counted
# high, and a stream whose upstream keeps to its cap must never be cut. A whole (JSON)
# answer cannot be cut: one above twice its cap and 64 tokens is flagged.
OUTPUT_OVER_CAP = "output_over_cap"  # the record's error code for either
STREAM_CAP_SLACK_DIVISOR = 4
STREAM_CAP_MARGIN = 32
ANSWER_CAP_FACTOR = 2
ANSWER_CAP_MARGIN = 64


def stream_output_ceiling(cap: int) -> int:
    """The output tokens (estimated) past which a stream is ended at its cap."""
    return cap + cap // STREAM_CAP_SLACK_DIVISOR + STREAM_CAP_MARGIN


def far_over_cap(cap: int, output_tokens: int) -> bool:
    """A whole answer far above its cap (flagged ``output_over_cap``)."""
    return output_tokens > ANSWER_CAP_FACTOR * cap + ANSWER_CAP_MARGIN
