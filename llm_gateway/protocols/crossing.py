"""How a request in the caller's protocol reaches one target: as it came, when the target
speaks that protocol, or translated (``translate/``) to one the target speaks.

A ``Crossing`` holds the two protocols of one attempt: the caller's (``caller``: its errors,
its end user) and the wire's (``wire``: the protocol the target is spoken to in, whose
reader meters the answer, so that a record keeps the provider's own figures). The
same-protocol crossing is the two the same, and touches no translator. A failover to a
target of another protocol is a new crossing (the request is read into the hub form once
per protocol).
"""

from __future__ import annotations

from llm_gateway import errors, jsonio
from llm_gateway.errors import ErrorShape
from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.protocols.chat import CHAT
from llm_gateway.protocols.embeddings import EMBEDDINGS
from llm_gateway.protocols.gemini import GEMINI
from llm_gateway.protocols.messages import MESSAGES
from llm_gateway.protocols.responses import RESPONSES
from llm_gateway.providers import Profile, UnsupportedParameter
from llm_gateway.translate import (
    EmbeddingsToGemini,
    StreamTranslation,
    Translation,
    Untranslatable,
    caller_status,
    translation,
)

# The protocol object of each wire protocol a provider may speak.
WIRES: dict[str, OpenAICompatible] = {"chat": CHAT, "embeddings": EMBEDDINGS,
                                      "gemini": GEMINI, "messages": MESSAGES,
                                      "responses": RESPONSES}
# Caller headers of one protocol's API that a target of another must not get (Anthropic's
# version and beta flags tune Anthropic's API only).
_PROTOCOL_HEADERS = {"messages": ("anthropic-version", "anthropic-beta")}


class Crossing:
    __slots__ = ("caller", "stream", "translation", "wire")

    def __init__(self, caller: OpenAICompatible, wire: str | None = None,
                 payload: dict | None = None, *, now: float = 0) -> None:
        self.caller = caller
        self.stream: StreamTranslation | None = None
        if wire is None or wire == caller.wire or payload is None:
            self.wire = caller
            self.translation: Translation | EmbeddingsToGemini | None = None
        else:  # raises Untranslatable for what the caller sent that no form holds
            self.wire = WIRES[wire]
            self.translation = translation(caller.wire or "", wire, payload, now=now)

    @property
    def dropped(self) -> list[str]:
        return self.translation.dropped if self.translation is not None else []

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        """Where the translated request goes under the target's API root."""
        assert self.translation is not None
        return self.translation.path(model, stream)

    def payload(self, profile: Profile, model: str, *, stream: bool) -> dict:
        """The translated body, as the target's profile takes it; raises UnsupportedParameter
        (Untranslatable is one) for what cannot cross."""
        assert self.translation is not None
        try:
            translated = self.translation.payload(model)
        except Untranslatable as refused:
            raise UnsupportedParameter(f"{refused}: the target speaks {self.wire.wire} "
                                       "and cannot take it") from None
        return self.wire.upstream_payload(profile, translated, stream=stream)

    def dropped_headers(self, names: set[str]) -> tuple[str, ...]:
        """The caller's protocol headers the target does not get."""
        if self.translation is None:
            return ()
        return tuple(name for name in _PROTOCOL_HEADERS.get(self.caller.wire or "", ())
                     if name in names)

    def client_status(self, status: int) -> int:
        return status if self.translation is None else caller_status(self.caller.wire or "",
                                                                      status)

    def reply(self, body: bytes) -> bytes | None:
        """A target's whole 200 answer in the caller's protocol (None: not JSON, relayed)."""
        assert self.translation is not None
        payload = jsonio.object_of(body)
        return None if payload is None else jsonio.dumps(self.translation.reply(payload))

    def error(self, profile: Profile, body: bytes, status: int, shape: ErrorShape) -> bytes:
        """A target's error answer in the caller's shape, the provider's message kept."""
        as_openai = jsonio.object_of(profile.error_body(body, status)) or {}
        error = as_openai.get("error")
        error = error if isinstance(error, dict) else {}
        message = error.get("message")
        return shape(self.client_status(status), str(error.get("type") or ""),
                     str(error.get("code") or ""),
                     message if isinstance(message, str) else f"upstream answered HTTP {status}")

    def start_stream(self) -> StreamTranslation:
        assert self.translation is not None
        self.stream = self.translation.stream()
        return self.stream

    def stream_error(self, code: str, message: str) -> bytes:
        """The gateway's own error inside a translated stream, in the caller's protocol."""
        assert self.stream is not None
        kind = errors.CATALOGUE[code]
        return self.stream.fail(kind.status, kind.type, code, message)


def refusal(caller: OpenAICompatible, wire: str | None, profile: Profile, payload: dict,
            model: str, *, stream: bool) -> str | None:
    """Why a target that speaks ``wire`` cannot take the request (None: it can), asked at
    admission so that a request no target takes is refused before any call."""
    try:
        crossing = Crossing(caller, wire, payload)
        if crossing.translation is None:
            caller.upstream_payload(profile, payload, stream=stream)
        else:
            crossing.payload(profile, model, stream=stream)
    except UnsupportedParameter as exc:
        return str(exc)
    except Untranslatable as refused:
        return f"{refused}: the target speaks {wire} and cannot take it"
    return None
