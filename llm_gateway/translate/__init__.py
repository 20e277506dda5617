"""Translation between wire protocols: a caller's request in its protocol to a target that
speaks another, and the target's answer (whole or event by event) back.

Each protocol is one module holding a ``Codec`` (``chat``, ``messages``, ``responses``,
``gemini``): it reads its own requests, answers and stream events into the hub form
(``form``) and writes them from it. A ``Translation`` is the caller's codec and the
target's, for one request. Pure: fed dicts, returning dicts and SSE frames. The
same-protocol path never comes here: its bytes are relayed as they came.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Protocol

from llm_gateway.translate.embeddings import EmbeddingsToGemini
from llm_gateway.translate.form import (
    Event,
    Failure,
    Finish,
    Reply,
    Request,
    Untranslatable,
)


class StreamReader(Protocol):
    """A target's stream, event by event, into the hub form's events."""

    def feed(self, payload: dict) -> list[Event]:
        """One decoded stream event (the JSON of its data)."""
        ...

    def end(self) -> list[Event]:
        """The target's stream reached the end its protocol defines (``[DONE]``,
        ``message_stop``, ``response.completed``, a last chunk with a finish reason):
        what is left to say, a Finish at the latest. Called once; nothing after it."""
        ...


class StreamWriter(Protocol):
    """The hub form's events as the caller's stream frames (whole SSE frames, bytes)."""

    def write(self, event: Event) -> bytes:
        """The frames ``event`` makes (b"" for none). After Finish or Failure the stream
        is ended in the caller's protocol (its last frame written)."""
        ...

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        """The end of a stream that failed after its status was sent (the gateway's own
        error: a cut upstream, a spent budget), as the caller's protocol writes an error
        in band, then its end."""
        ...


class Codec(Protocol):
    """One wire protocol, both ways."""

    name: str  # the protocol's name in a provider's ``protocols:`` (chat, messages, ...)

    def read_request(self, payload: dict) -> Request:
        """A caller's body in this protocol (already checked by the protocol's own rules)
        into the hub form; what the form cannot hold goes to ``dropped`` or raises
        Untranslatable."""
        ...

    def write_request(self, request: Request, *, model: str) -> dict:
        """The body a target of this protocol takes for ``request``, naming ``model``;
        appends to ``request.dropped`` what the target cannot take and only tuned
        behaviour; raises Untranslatable for what would change the conversation."""
        ...

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        """Where a target of this protocol takes the request, under its API root: (path,
        query) (chat: ("/chat/completions", ""); Gemini's names the model)."""
        ...

    def read_reply(self, body: dict) -> Reply:
        """A target's whole answer (200) into the hub form."""
        ...

    def write_reply(self, reply: Reply, request: Request) -> dict:
        """The caller's whole answer for ``reply`` (``request``: what it asked, e.g. the
        model it named)."""
        ...

    def stream_reader(self) -> StreamReader: ...

    def stream_writer(self, request: Request) -> StreamWriter: ...


# Protocol name -> module holding its CODEC. Imported when first asked for.
_MODULES = {"chat": "chat", "messages": "messages", "responses": "responses",
            "gemini": "gemini"}
_CODECS: dict[str, Codec] = {}

# Which of a target's protocols a caller's request is best translated to, in order of
# preference: the closest in what it can say (a Responses caller loses least to Messages,
# which has reasoning blocks and tool ids; chat is what every provider speaks).
PREFERENCES: dict[str, tuple[str, ...]] = {
    "chat": ("messages", "responses", "gemini"),
    "messages": ("chat", "responses", "gemini"),
    "responses": ("messages", "chat", "gemini"),
    "embeddings": ("gemini",),
}


def codec(name: str) -> Codec:
    found = _CODECS.get(name)
    if found is None:
        module = importlib.import_module(f"llm_gateway.translate.{_MODULES[name]}")
        found = _CODECS[name] = module.CODEC
    return found


def target_protocol(caller: str, speaks: Iterable[str]) -> str | None:
    """The protocol a target that speaks ``speaks`` is sent a ``caller`` request in: the
    caller's own (no translation), else the first it can be translated to; None: none."""
    spoken = set(speaks)
    if caller in spoken:
        return caller
    return next((name for name in PREFERENCES.get(caller, ()) if name in spoken), None)


# Anthropic's 529 (overloaded) is a status only Anthropic's SDKs know: another caller's
# SDK raises its server error class for a 503.
_STATUS_FOR_CALLER = {"messages": {}, "chat": {529: 503}, "responses": {529: 503}}


def caller_status(caller: str, status: int) -> int:
    return _STATUS_FOR_CALLER.get(caller, {529: 503}).get(status, status)


class StreamTranslation:
    """A target's stream to a caller's, one decoded event at a time."""

    __slots__ = ("ended", "reader", "writer")

    def __init__(self, reader: StreamReader, writer: StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.ended = False  # the caller's stream has had its last frame

    def feed(self, payload: dict) -> bytes:
        return self._write(self.reader.feed(payload))

    def end(self) -> bytes:
        """The target's stream reached its end: the caller's ends too."""
        return b"" if self.ended else self._write(self.reader.end())

    def fail(self, status: int, type: str, code: str, message: str) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        return self.writer.fail(status, type, code, message)

    def _write(self, events: list[Event]) -> bytes:
        if not events or self.ended:
            return b""
        out = []
        for event in events:
            out.append(self.writer.write(event))
            if isinstance(event, Finish | Failure):
                self.ended = True
                break
        return b"".join(out)


class Translation:
    """One request's translation: the caller's body read once, written for each target of
    the protocol ``target`` (a failover may go to another protocol: another Translation)."""

    __slots__ = ("caller", "request", "target")

    def __init__(self, caller: str, target: str, payload: dict, *, now: float = 0) -> None:
        self.caller = codec(caller)
        self.target = codec(target)
        self.request = self.caller.read_request(payload)
        self.request.now = int(now)

    @property
    def dropped(self) -> list[str]:
        return self.request.dropped

    def payload(self, model: str) -> dict:
        """The target's body naming ``model``; raises Untranslatable."""
        return self.target.write_request(self.request, model=model)

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        return self.target.path(model, stream)

    def reply(self, body: dict) -> dict:
        return self.caller.write_reply(self.target.read_reply(body), self.request)

    def stream(self) -> StreamTranslation:
        return StreamTranslation(self.target.stream_reader(),
                                 self.caller.stream_writer(self.request))




def translation(caller: str, target: str, payload: dict, *,
                now: float = 0) -> Translation | EmbeddingsToGemini:
    """The translation of one request from ``caller``'s protocol to ``target``'s; raises
    Untranslatable for what the caller sent that cannot cross. Embeddings are a pair of
    their own (no conversation to put in the hub form)."""
    if (caller, target) == ("embeddings", "gemini"):
        return EmbeddingsToGemini(payload, now=now)
    return Translation(caller, target, payload, now=now)


__all__ = ["Codec", "EmbeddingsToGemini", "StreamReader", "StreamTranslation", "StreamWriter",
           "Translation", "Untranslatable", "caller_status", "codec", "target_protocol",
           "translation"]
