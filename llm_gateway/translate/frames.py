"""SSE frames as the translators' writers make them: one whole frame per event."""

from __future__ import annotations

import orjson

DONE = b"data: [DONE]\n\n"


def data_frame(payload: dict) -> bytes:
    """``data: {json}`` and the blank line (chat's chunks, Gemini's)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def event_frame(name: str, payload: dict) -> bytes:
    """``event: name``, ``data: {json}`` and the blank line (Anthropic's and Responses'
    events, whose payload's ``type`` says the name again)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
