"""What adapters hand the engine and get back: the engine's own request and response.

Adapters translate their objects (an ASGI scope, a mitmproxy flow) into an
``IncomingRequest`` and a ``GatewayResponse`` back into theirs; nothing else crosses. An
adapter never finishes a request itself: it tells the response it is done with it
(``GatewayResponse.close``: written, or the client left), and the engine finishes it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from llm_gateway.errors import Headers
from llm_gateway.keys import KeyRecord


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
    """A response the engine produced for an adapter to send. ``chunks`` is set for a
    stream: relay each as it comes. Whatever happens, the adapter says once that it is
    done with the answer (``close``, in a ``finally``; ``done`` for a whole answer with no
    stream left open), and whether its client left before the end; the engine then closes
    the stream and finishes the request, exactly once."""

    status: int
    headers: Headers
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    # The engine's: finishes the request, told whether the client left (None: infer it).
    on_finish: Callable[[bool | None], None] | None = None
    ended: bool = False  # set by the engine: the stream was read to its end
    _closed: bool = False

    async def close(self, *, client_gone: bool | None = None) -> None:
        """Done with this answer. ``client_gone``: the client left before the end; None (a
        pull-based adapter, the in-process transport): the engine tells from how far the
        stream was read."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.chunks is not None:
                await self.chunks.aclose()  # type: ignore[attr-defined]
        finally:
            if self.on_finish is not None:
                self.on_finish(client_gone)

    def done(self, *, client_gone: bool = False) -> None:
        """``close`` for an answer with no stream left open (none, or one read whole)."""
        if self._closed:
            return
        self._closed = True
        if self.on_finish is not None:
            self.on_finish(client_gone)


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
