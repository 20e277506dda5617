"""What adapters hand the engine and get back: the engine's own request and response.

Adapters translate their objects (an ASGI scope, a mitmproxy flow) into an
``IncomingRequest`` and a ``GatewayResponse`` back into theirs; nothing else crosses.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum

from llm_gateway.errors import Headers
from llm_gateway.keys import KeyRecord


class EndpointKind(StrEnum):
    CHAT = "chat.completions"
    EMBEDDINGS = "embeddings"
    MODELS = "models"
    OTHER = "other"


KIND_BY_PATH = {
    "/chat/completions": EndpointKind.CHAT,
    "/embeddings": EndpointKind.EMBEDDINGS,
    "/models": EndpointKind.MODELS,
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str
    kind: EndpointKind


@dataclass(slots=True)
class IncomingRequest:
    """What an adapter hands the engine. ``path`` is relative to the API root."""

    method: str
    path: str
    headers: Headers  # names lower-case
    body: bytes
    adapter: str
    query: str = ""
    # Set only by in-process adapters that know the caller already (never from the wire):
    # the engine then admits it as this principal instead of authenticating a header.
    principal: KeyRecord | None = None
    # Set only by an adapter that intercepts provider hosts (the sidecar, regular mode):
    # the (host, port) the app sent the request to. A model name that is no alias goes
    # to that host's provider.
    called_host: tuple[str, int] | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(slots=True)
class GatewayResponse:
    """A response the engine produced for an adapter to send."""

    status: int
    headers: Headers
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None  # set for streams; relay each as it comes


# Request ids: a random prefix per process and a counter. Unique across replicas without
# the cost of uuid4() per request (it showed in profiles).
_PROCESS_TAG = os.urandom(6).hex()
_request_counter = itertools.count(1)


def _new_process_tag() -> None:
    """A forked process (a `serve --workers` worker) is another process: its own tag."""
    global _PROCESS_TAG, _request_counter
    _PROCESS_TAG, _request_counter = os.urandom(6).hex(), itertools.count(1)


os.register_at_fork(after_in_child=_new_process_tag)


def process_tag() -> str:
    """This process's own tag (new after a fork): what names it as a reservation's owner."""
    return _PROCESS_TAG


def next_request_id() -> str:
    return f"req_{_PROCESS_TAG}{next(_request_counter):012x}"
