"""The sidecar's connection limits and its interception rule: a mitmproxy addon.

- **Deadlines**: each client connection gets the ``ConnectionWatch`` of
  ``connection_limits`` (header, body and idle timeouts), fed by the connection's HTTP/1
  parser. A connection past its deadline is closed as mitmproxy closes one past its own
  ``tcp_timeout`` (an inactivity timer that trickling bytes keep resetting): its handler
  task is cancelled. On plain HTTP it first gets a 408; inside TLS only mitmproxy's layers
  can write, so there the connection is just closed.
- **Header size**: mitmproxy buffers a request head without limit ("FIXME: protect against
  header size DoS" in its HTTP/1 layer). Every client connection's HTTP/1 layer is the one
  below, which answers 431 (through TLS too) once its buffer would pass ``MAX_HEADER_BYTES``;
  the bytes mitmproxy holds while it decides what a connection speaks (a TLS ClientHello
  it waits to see whole, a request it sniffs for a Host header) are bounded likewise.
- **Interception follows the CONNECT target, never the SNI**: mitmproxy's ``allow_hosts``
  intercepts a tunnel when *any* of its names matches, the SNI and the Host header included,
  so ``CONNECT evil.example:443`` with SNI ``api.venice.ai`` would have its TLS intercepted.
  Here a tunnel to a host the sidecar does not intercept (neither an LLM host nor a known
  one no provider serves) is always passed through untouched, counted and logged
  (``mitm_tunnels``).
- **Body size**: a request body over ``REQUEST_BODY_LIMIT_BYTES`` is refused (413, the
  engine's answer) as soon as its declared length says so, or its bytes pass the limit,
  and the connection closed: mitmproxy would otherwise buffer the whole body first.
- **HTTP/1.1 towards clients**: the watch follows one request at a time per connection;
  HTTP/2 would carry requests past it. SDKs speak HTTP/1.1, and on loopback HTTP/2 buys
  nothing, so ``configure`` keeps mitmproxy's ``http2`` off.

Add it to the master after mitmproxy's ``NextLayer`` addon: it reviews that addon's choice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mitmproxy import ctx
from mitmproxy.connection import Client
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer
from mitmproxy.proxy.layers.http import Http1Server
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.mode_specs import RegularMode
from mitmproxy.proxy.server import ConnectionIO

from llm_gateway.adapters.connection_limits import (
    ConnectionLimits,
    ConnectionWatch,
    Wait,
    answer_bytes,
)
from llm_gateway.adapters.mitm_tunnels import CountedTunnelLayer, Tunnel, Tunnels
from llm_gateway.engine import Gateway
from llm_gateway.errors import Rejection

__all__ = ["ConnectionGuard"]

log = logging.getLogger("llm_gateway.sidecar")


class ConnectionGuard:
    """mitmproxy addon: connection limits and the CONNECT-target rule (module docstring)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._limits = ConnectionLimits.from_settings(gateway.settings)
        self._watched: dict[str, _Watched] = {}  # client connection id -> its watch
        self._tunnels = Tunnels.of(gateway.telemetry.registry)

    def configure(self, updated: set[str]) -> None:
        if ctx.options.http2:
            ctx.options.update(http2=False)

    def client_connected(self, client: Client) -> None:
        proxy = ctx.master.addons.get("proxyserver")
        handler = proxy.connections.get(client.id) if proxy is not None else None
        io = handler.transports.get(client) if handler is not None else None
        if io is not None:  # None: a connection no proxy server of this master accepted
            loop = asyncio.get_running_loop()
            self._watched[client.id] = _Watched(
                client, io, self._limits, loop,
                self._gateway.settings.request_body_limit_bytes, self._gateway.body_too_large())

    def client_disconnected(self, client: Client) -> None:
        watched = self._watched.pop(client.id, None)
        if watched is not None:
            watched.watch.close()
            if watched.tunnel is not None:
                self._tunnels.closed(watched.tunnel)

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        context = nextlayer.context
        watched = self._watched.get(context.client.id)
        if watched is None:
            return
        if self._is_foreign_tunnel(nextlayer):
            # Whatever the SNI or Host header says: untouched, the origin's certificate.
            host, port = context.server.address[:2]
            watched.tunnel = watched.tunnel or self._tunnels.opened(host, port)
            nextlayer.layer = CountedTunnelLayer(context, watched.tunnel)
            watched.watch.close()
            return
        chosen = nextlayer.layer
        if chosen is None or _waits_for_client_hello(chosen, nextlayer.data_client()):
            nextlayer.layer = None  # more data first: bounded here, as a request head is
            if len(nextlayer.data_client()) > self._limits.max_header_bytes:
                watched.reap(self._limits.too_large_answer(), answer=False)
            return
        http_layer = _http_layer(chosen)
        if http_layer is not None:
            # Taken by the HttpLayer instead of a plain Http1Server when it starts.
            server = _WatchedHttp1Server(http_layer.context.fork(), watched)
            http_layer.connections[context.client] = server

    def _is_foreign_tunnel(self, nextlayer: layer.NextLayer) -> bool:
        """What a regular-mode CONNECT tunnel carries, to a host that is not intercepted
        (an LLM host, or a known one no provider serves)."""
        context = nextlayer.context
        if not isinstance(context.client.proxy_mode, RegularMode):
            return False
        if context.server.address is None:
            return False  # the proxy's own HTTP layer, before any CONNECT
        host, port = context.server.address[:2]
        return not self._gateway.interception.intercepts(host, port)


class _Watched:
    """One client connection: its watch, and the way to end it."""

    def __init__(self, client: Client, io: ConnectionIO, limits: ConnectionLimits,
                 loop: asyncio.AbstractEventLoop, body_limit: int,
                 body_too_large: Rejection) -> None:
        self.client = client
        self.io = io
        self.limits = limits
        self.body_limit = body_limit
        self.body_too_large = body_too_large
        self.watch = ConnectionWatch(limits, loop, self._expired)
        self.tunnel: Tunnel | None = None  # once it is a tunnel to another host

    def _expired(self, wait: Wait, request: object | None) -> None:
        # A request with a late head or body has had nothing sent for it yet (mitmproxy
        # answers once a body is in); inside TLS a raw write would be garbage.
        answer = wait.answerable and not self.client.tls
        self.reap(self.limits.timeout_answer(wait), answer=answer)

    def reap(self, rejection: Rejection, *, answer: bool) -> None:
        self.watch.close()
        if answer and self.io.writer is not None:
            self.io.writer.write(answer_bytes(rejection))
        if self.io.handler is not None:
            # mitmproxy's own way to end a connection: the handler closes the socket
            # (sending what was written first), and every hook learns the client is gone.
            self.io.handler.cancel("llm-gateway connection limits")
        elif self.io.writer is not None:
            self.io.writer.close()


class _WatchedHttp1Server(Http1Server):
    """mitmproxy's HTTP/1 server side, reporting its states to the watch and refusing a
    request head (or what is buffered behind a request) past ``MAX_HEADER_BYTES``."""

    def __init__(self, context: Any, watched: _Watched) -> None:
        self._watched = watched
        self._body_bytes = 0  # of the request being read
        super().__init__(context)

    # The parser's state is a method it assigns as it goes: every transition is reported.
    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.__dict__.get("_state", self.start)

    @state.setter
    def state(self, new: Any) -> None:
        old = self.__dict__.get("_state", self.start)
        self.__dict__["_state"] = new
        _report(self._watched.watch, self, old.__name__, new.__name__)

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if not isinstance(event, events.DataReceived) or self.state == self.passthrough:
            yield from super()._handle_event(event)
            return
        self._watched.watch.received()
        if self.state == self.read_body:
            self._body_bytes += len(event.data)
        limit, data = self._watched.limits.max_header_bytes, event.data
        # The parser is fed no more than may still be head: a read that also holds the
        # head's end and a body is split where the limit falls, and the rest follows once
        # the head turned out complete. While a response is pending (``wait``), mitmproxy
        # only buffers what arrives, so all of it counts.
        while self.state in (self.read_headers, self.wait) and len(self.buf) + len(data) > limit:
            room = limit - len(self.buf)
            if room <= 0 or self.state == self.wait:
                yield from self._refuse()
                return
            head, data = data[:room], data[room:]
            yield from super()._handle_event(events.DataReceived(event.connection, head))
        if data:
            yield from super()._handle_event(events.DataReceived(event.connection, data))
        if self.state == self.read_body and self._body_too_large():
            self.state = self.done
            yield commands.SendData(self.conn, answer_bytes(self._watched.body_too_large))
            yield commands.CloseConnection(self.conn)
        elif self.state != self.read_body:
            self._body_bytes = 0

    def _body_too_large(self) -> bool:
        """Declared over the limit, or past it in bytes (chunk framing allowed for)."""
        limit = self._watched.body_limit
        declared = self.request.headers.get("content-length", "") if self.request else ""
        if declared.isdigit() and int(declared) > limit:
            return True
        return self._body_bytes > limit + 65536

    def _refuse(self) -> layer.CommandGenerator[None]:
        # Reading a head means no response is pending: the 431 is this request's answer.
        # While one is (``wait``), only closing is safe.
        answer = self.state == self.read_headers
        self.state = self.done
        if answer:
            rejection = self._watched.limits.too_large_answer()
            yield commands.SendData(self.conn, answer_bytes(rejection))
        yield commands.CloseConnection(self.conn)


def _report(watch: ConnectionWatch, server: _WatchedHttp1Server, old: str, new: str) -> None:
    """An HTTP/1 parser state change, as the watch's events."""
    if new == "read_body":
        watch.headers_complete(server)
    elif new == "wait":  # the request is in; its response is pending
        if old == "read_headers":
            watch.headers_complete(server)
        watch.body_complete(server)
    elif new in ("read_headers", "passthrough") and old != "start":
        watch.body_complete(server)
        watch.answered(server)
        if new == "passthrough":
            request = server.request
            if request is not None and request.method == "CONNECT":
                watch.restart()  # the tunnel's first request is due in time too
            else:
                watch.close()  # an upgraded connection is no longer HTTP


def _http_layer(chosen: layer.Layer) -> HttpLayer | None:
    """The HttpLayer in the stack mitmproxy chose (behind a TLS layer, say), if any."""
    current: layer.Layer | None = chosen
    while current is not None and not isinstance(current, HttpLayer):
        current = getattr(current, "child_layer", None)
    return current


def _waits_for_client_hello(chosen: layer.Layer, data: bytes) -> bool:
    """Whether the chosen stack starts a TLS handshake whose ClientHello is incomplete:
    the TLS layer would buffer it whole (up to 16 MiB), so it is awaited here instead."""
    current: layer.Layer | None = chosen
    while current is not None and not isinstance(current, ClientTLSLayer):
        current = getattr(current, "child_layer", None)
    if current is None or not starts_like_tls_record(data):
        return False
    try:
        return parse_client_hello(data) is None
    except ValueError:
        return False  # not TLS after all: mitmproxy's layer says so to the client

