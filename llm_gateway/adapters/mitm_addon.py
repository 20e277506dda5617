"""The gateway as a mitmproxy addon: the mitmproxy twin of the ASGI adapter.

It translates flows into the engine's ``IncomingRequest`` and the engine's answers back
into flows; every rule (which hosts are LLM hosts, which paths may be forwarded, keys,
limits, the provider key, the egress policy, retries, timeouts, error bodies) is the
engine's, and the engine sends every admitted request (failover, timeouts, error
shapes, usage chunks: what ``serve`` does):

- not a stream: the engine answers in the ``request`` hook and the addon sets the answer
  as ``flow.response``; mitmproxy opens no upstream connection for the flow.
- a stream: mitmproxy cannot stream an answer an addon makes, so the flow is forwarded to
  the engine's stream relay on a loopback port (``mitm_relay``), which sends it and writes
  the answer back as it arrives; mitmproxy carries it to the client chunk by chunk.

For a request to an LLM host the hooks run in this order::

    http_connect     (CONNECT, regular mode) egress policy for the hosts not intercepted
    requestheaders   is it an LLM host? keep its body buffered; refuse an oversized one
    request          admit: answer the rejection; the engine's answer (not a stream);
                     or forward to the stream relay (a stream)
    responseheaders  forwarded: the relay's answer passes through, chunk by chunk
    error            finish what the relay never got (the relay finishes the rest)

Fail closed. mitmproxy runs each hook inside a safe-call wrapper that logs an exception
and lets the flow continue, unchanged: an exception after the gateway key was checked
would forward the caller's request, gateway key and all, to the host it named. So every
hook catches everything and answers with an error of its own, or kills the flow when the
response has started; nothing reaches a provider unless the engine admitted it.

mitmproxy must connect lazily (``connection_strategy=lazy``: a rejected request never
opens a connection, not even TCP) and must not sniff upstream certificates
(``upstream_cert=false``); ``configure`` enforces both, ``allow_hosts``, which keeps
every other host's TLS untouched, and ``rawtcp=false``: what an intercepted host's client
sends that is neither TLS nor HTTP is refused as malformed HTTP, never relayed raw.

A known LLM host that no provider serves (``api.openai.com`` with no OpenAI provider) is
intercepted too, and every request to it answered 403 ``provider_not_configured`` in the
shape its clients read, under either egress policy: never a tunnel.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import url as mitm_url
from mitmproxy.proxy.mode_specs import ReverseMode

from llm_gateway import errors
from llm_gateway.adapters.mitm_relay import TOKEN_HEADER, StreamRelay
from llm_gateway.config import ConfigError, load_settings
from llm_gateway.engine import Gateway
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange
from llm_gateway.http_types import GatewayResponse, IncomingRequest
from llm_gateway.interception import not_configured
from llm_gateway.known_hosts import hostname
from llm_gateway.wiring import build_gateway

log = logging.getLogger("llm_gateway.sidecar")

ADAPTER_NAME = "sidecar"
# Where a flow's gateway state lives: on the flow, so it goes when mitmproxy drops it.
_STATE_KEY = "llm_gateway"
# mitmproxy's message when the client side of a connection closed.
_CLIENT_DISCONNECTED = "Client disconnected."
# How often a request the engine is sending checks that its client is still there.
_DISCONNECT_POLL_SECONDS = 0.1
_UNSAFE_IN_HEADER = re.compile(rb"[\r\n\0]")


@dataclass(slots=True)
class _LlmFlow:
    """What the addon knows about a flow to an LLM host."""

    api_root: str
    exchange: Exchange | None = None
    # The engine's answer (not a stream), closed once mitmproxy has it (``response``).
    answer: GatewayResponse | None = None
    # Set once the request was forwarded to the stream relay: the relay closes its answer.
    relay_token: str | None = None


class GatewayAddon:
    """mitmproxy addon: gateway keys, limits, routing and metering on LLM traffic.

    ``llm-gateway sidecar`` passes the engine it built; under ``mitmdump -s`` the addon
    builds one from the environment (and the ``llm_gateway_config`` option).
    """

    def __init__(self, gateway: Gateway | None = None) -> None:
        self._gateway = gateway
        self._relay: StreamRelay | None = None
        # Admitted and not yet finished: finished at shutdown if mitmproxy never says how
        # they ended. Removed at finish, so it holds only requests in flight.
        self._in_flight: set[Exchange] = set()
        self._following_routes = False

    def engine(self) -> Gateway:
        # A method, not a property: mitmproxy inspects every attribute of an addon when it
        # collects commands, before configure() has built the engine.
        if self._gateway is None:
            raise RuntimeError("the llm-gateway addon has no configuration")
        return self._gateway

    # ---- lifecycle ----------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "llm_gateway_config", str | None, None,
            "llm-gateway YAML settings file (default: LLM_GATEWAY_CONFIG); the environment "
            "wins over it, as for `llm-gateway serve`.",
        )

    def configure(self, updated: set[str]) -> None:
        if self._gateway is None:
            try:
                settings = load_settings(config_file=ctx.options.llm_gateway_config)
                self._gateway = build_gateway(settings)
            except ConfigError as exc:
                raise exceptions.OptionsError(f"llm-gateway: {exc}") from None
        elif "llm_gateway_config" in updated and ctx.options.llm_gateway_config:
            log.warning("llm_gateway_config changed: restart mitmproxy to apply it")
        if ctx.options.ignore_hosts:
            # An ignored LLM host would be tunnelled with the caller's gateway key in it;
            # every host but the LLM hosts is passed through already.
            raise exceptions.OptionsError(
                "llm-gateway: ignore_hosts is not supported; hosts other than the LLM hosts "
                "are passed through untouched already"
            )
        self._enforce(ctx.options)
        if not self._following_routes:
            # A provider added live is intercepted from its first request on.
            options = ctx.options
            self.engine().router.on_table(lambda _: self._follow_routes(options))
            self._following_routes = True

    def _follow_routes(self, options: Any) -> None:
        try:
            before = options.allow_hosts
            self._enforce(options)
            if options.allow_hosts != before:
                log.info("intercepted hosts: %s", self.engine().interception.described())
        except Exception:  # the routes changed all the same; the hosts stay as they were
            log.exception("llm-gateway: could not update the intercepted hosts")

    def _enforce(self, options: Any) -> None:
        required = self._required_options(options)
        changed = {
            name: value for name, value in required.items()
            if getattr(options, name) != value
        }
        if changed:
            options.update(**changed)

    def _required_options(self, options: Any) -> dict[str, Any]:
        reverse_only = bool(options.mode) and all(
            spec.startswith("reverse") for spec in options.mode
        )
        return {
            # A rejected request must not open even a TCP connection to the provider, and
            # CONNECT api.venice.ai must not be answered by connecting there first.
            "connection_strategy": "lazy",
            "upstream_cert": False,
            # TLS is intercepted for the LLM hosts only; every other host keeps its own
            # certificate. A reverse proxy serves nothing but the gateway.
            "allow_hosts": ([] if reverse_only
                            else self.engine().interception.intercepted_host_patterns()),
            "rawtcp": False,
        }

    async def running(self) -> None:
        await self.start()

    async def start(self) -> None:
        """Start the engine and the stream relay (the sidecar calls this before it opens
        its proxy port; under mitmdump the ``running`` hook does)."""
        await self.engine().start()
        if self._relay is None:
            self._relay = StreamRelay(self.engine())
            await self._relay.start()

    async def done(self) -> None:
        for exchange in list(self._in_flight):
            self._abandon(exchange, client_gone=False, failure=(503, "gateway_shutdown", None))
        if self._relay is not None:
            await self._relay.close()
        await self.engine().close()

    # ---- requests -----------------------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A CONNECT to a host that is not intercepted: the egress policy decides."""
        try:
            host, port = flow.request.host, flow.request.port
            if self.engine().interception.intercepts(host, port):
                return  # each request inside is the engine's, or refused
            rejection = self.engine().egress_rejection(host, port)
            if rejection is not None:
                log.warning("refused CONNECT %s:%d: %s", hostname(host) or "(invalid host)",
                            port, rejection.code)
                self._refuse(flow, rejection)
        except Exception:
            log.exception("llm-gateway: CONNECT failed; refusing the tunnel")
            _answer_failure(flow)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            api_root = self._api_root(flow)
            if api_root is None:
                # A known host no provider serves, or plain HTTP to another host (TLS to
                # one is never intercepted).
                self._refuse_unserved(flow)
                return
            flow.metadata[_STATE_KEY] = _LlmFlow(api_root)
            # Buffered, whatever stream_large_bodies says: no byte goes upstream before
            # the engine admitted the request.
            flow.request.stream = False
            declared = flow.request.headers.get("content-length", "")
            limit = self.engine().settings.request_body_limit_bytes
            if declared.isdigit() and int(declared) > limit:
                self._refuse(flow, self.engine().body_too_large())
        except Exception:
            log.exception("llm-gateway: requestheaders failed; answering 500")
            _answer_failure(flow)

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return  # answered already (requestheaders, or another addon)
        state = flow.metadata.get(_STATE_KEY)
        try:
            if not isinstance(state, _LlmFlow):
                # Classified again rather than trusted: a flow to an LLM host that did
                # not pass requestheaders must not go on unchanged.
                api_root = self._api_root(flow)
                if api_root is None:
                    self._refuse_unserved(flow)
                    return  # refused, or another host's
                state = flow.metadata[_STATE_KEY] = _LlmFlow(api_root)
            await self._admit(flow, state)
        except Exception:
            log.exception("llm-gateway: request failed; answering 500, nothing forwarded")
            if isinstance(state, _LlmFlow):
                if state.exchange is not None:
                    self._abandon(state.exchange, client_gone=False,
                                  failure=(500, "gateway_error", None))
                if state.relay_token is not None and self._relay is not None:
                    self._relay.withdraw(state.relay_token)
                state.relay_token = None
            _answer_failure(flow)

    def _refuse_unserved(self, flow: http.HTTPFlow) -> None:
        """A request to a host no provider serves: a known LLM host's is refused in its
        clients' shape; another host's is the egress policy's (through, or refused)."""
        request = flow.request
        interception = self.engine().interception
        known = interception.unserved_known_host(request.host, request.port)
        if known is None:
            rejection = interception.egress_rejection(request.host, request.port)
            if rejection is not None:
                self._refuse(flow, rejection)
            return
        rejection = not_configured(known, request.host)
        # The host matched the list, so it is a plain host name; the method is checked.
        log.warning("refused %s %s:%d: provider_not_configured (%s: no provider serves it)",
                    request.method if request.method.isalpha() else "request",
                    request.host.lower().rstrip("."), request.port, known.provider)
        self._refuse(flow, rejection, keep_shape=True)

    def _refuse(self, flow: http.HTTPFlow, rejection: Rejection, *,
                keep_shape: bool = False) -> None:
        """Turned away before admission, through the engine: the answer carries the
        request and trace ids, and the refusal has its span, metric and log line.
        ``keep_shape``: written as ``rejection`` is, not in the path's protocol's shape."""
        request = flow.request
        path, _, query = request.path.partition("?")
        answer = self.engine().refuse(IncomingRequest(
            method=request.method, path=path,
            headers=[(name.lower(), value) for name, value in request.headers.items(multi=True)],
            body=b"", adapter=ADAPTER_NAME, query=query), rejection)
        if keep_shape:
            answer.shape = rejection.shape
        _answer(flow, answer)

    async def _admit(self, flow: http.HTTPFlow, state: _LlmFlow) -> None:
        request = flow.request
        path, _, query = request.path.partition("?")
        relative = self.engine().path_under_root(state.api_root, path)
        if relative is None:
            self._refuse(flow, errors.endpoint_not_allowed(request.method, path))
            return
        body = request.raw_content or b""
        # Regular mode: the provider host the app called, the one interception decided on
        # (a reverse proxy is the gateway's own base URL: no provider's host).
        called = None if _is_reverse(flow) else (request.host, request.port)
        admitted = await self.engine().admit(IncomingRequest(
            method=request.method, path=relative,
            headers=[(name.lower(), value) for name, value in request.headers.items(multi=True)],
            body=body, adapter=ADAPTER_NAME, query=query, called_host=called,
        ))
        if isinstance(admitted, Rejection):
            _answer(flow, admitted)
            return
        state.exchange = admitted
        self._in_flight.add(admitted)
        if not admitted.stream:
            await self._respond(flow, admitted)
            return
        if self._relay is None:
            await self.start()
        assert self._relay is not None
        token = self._relay.register(admitted)
        request.url = f"http://127.0.0.1:{self._relay.port}/relay"
        request.headers = _mitm_headers([(TOKEN_HEADER, token), ("content-length", "0")])
        request.host_header = mitm_url.hostport(request.scheme, request.host, request.port)
        request.content = b""
        state.relay_token = token

    async def _respond(self, flow: http.HTTPFlow, exchange: Exchange) -> None:
        """The engine sends and answers; finished in ``response`` (or ``error``).

        mitmproxy holds a client's disconnect until this hook returns, so a watcher polls
        the client connection and cancels the wait when it went away, as the ASGI adapter
        cancels its relay."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        gone = False

        def watch() -> None:
            nonlocal gone, timer
            if _client_gone(flow):
                gone = True
                task.cancel()
            else:
                timer = loop.call_later(_DISCONNECT_POLL_SECONDS, watch)

        timer = loop.call_later(_DISCONNECT_POLL_SECONDS, watch)
        state = flow.metadata[_STATE_KEY]
        try:
            response = state.answer = await self.engine().respond(exchange)
            body, chunks = response.body, response.chunks
            if chunks is not None:
                # A stream the caller did not ask for: read whole, through the observer.
                body = b"".join([chunk async for chunk in chunks])
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            self._in_flight.discard(exchange)
            if state.answer is None:
                self.engine().abandon(exchange, client_gone=True)
            else:
                await state.answer.close(client_gone=True)
            _kill(flow)
            return
        finally:
            timer.cancel()
        flow.response = http.Response.make(
            response.status, body,
            _mitm_headers([*response.headers, ("content-length", str(len(body)))]),
        )

    def _api_root(self, flow: http.HTTPFlow) -> str | None:
        """The API root of the flow's LLM host; None when it goes to another host."""
        if _is_reverse(flow):
            # A reverse proxy is the gateway's base URL: the same root as the ASGI app's.
            return self.engine().settings.api_prefix
        return self.engine().api_root_for_host(flow.request.host, flow.request.port)

    # ---- responses ----------------------------------------------------------------

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """The relay's answer, already the client's: through as it arrives."""
        state = flow.metadata.get(_STATE_KEY)
        if isinstance(state, _LlmFlow) and state.relay_token is not None and flow.response:
            flow.response.stream = True

    def response(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_STATE_KEY)
        if not isinstance(state, _LlmFlow) or state.exchange is None:
            return
        if state.relay_token is None:
            self._done(state)  # the engine's own answer, observed as it was made
        else:
            self._in_flight.discard(state.exchange)  # the relay closed its answer

    def error(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_STATE_KEY)
        if not isinstance(state, _LlmFlow) or state.exchange is None:
            return
        exchange = state.exchange
        try:
            if state.relay_token is not None and self._relay is not None:
                if self._relay.withdraw(state.relay_token) is None:
                    self._in_flight.discard(exchange)  # the relay has it and closes it
                    return
                # Never reached the relay: mitmproxy could not connect to its own port.
                self._abandon(exchange, client_gone=_client_gone(flow),
                              failure=(502, "gateway_error", None))
                return
            self._done(state, client_gone=_client_gone(flow))
        except Exception:
            log.exception("llm-gateway: error hook failed")

    def _done(self, state: _LlmFlow, *, client_gone: bool = False) -> None:
        """Done with the flow's answer (read whole, its stream closed): the engine
        finishes its request."""
        assert state.exchange is not None
        self._in_flight.discard(state.exchange)
        if state.answer is None:
            self.engine().abandon(state.exchange, client_gone=client_gone)
        else:
            state.answer.done(client_gone=client_gone)

    def _abandon(self, exchange: Exchange, *, client_gone: bool,
                 failure: tuple[int, str, str | None] | None = None) -> None:
        self._in_flight.discard(exchange)
        self.engine().abandon(exchange, client_gone=client_gone, failure=failure)


# ---- translation helpers ---------------------------------------------------------------


def _mitm_headers(headers: Iterable[tuple[str, str]]) -> http.Headers:
    # mitmproxy decodes header bytes as UTF-8 with surrogateescape: the same way back.
    encoded = [
        (name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
        for name, value in headers
    ]
    if any(_UNSAFE_IN_HEADER.search(name + value) for name, value in encoded):
        # mitmproxy writes CR and LF through: a value holding one would split the answer.
        # None the gateway writes does (caller_text); the hooks answer this with a 500.
        raise ValueError("a response header holds CR, LF or NUL")
    return http.Headers(encoded)


def _answer(flow: http.HTTPFlow, rejection: Rejection) -> None:
    """Answer from the sidecar: mitmproxy then opens no connection for this request."""
    flow.response = http.Response.make(
        rejection.status, rejection.body, _mitm_headers(rejection.all_headers())
    )


def _answer_failure(flow: http.HTTPFlow, status: int = 500) -> None:
    try:
        failure = errors.gateway_error()
        failure.status = status
        _answer(flow, failure)
    except Exception:
        _kill(flow)


def _kill(flow: http.HTTPFlow) -> None:
    if flow.killable:
        flow.kill()


def _client_gone(flow: http.HTTPFlow) -> bool:
    error = flow.error
    if error is not None and error.msg == _CLIENT_DISCONNECTED:
        return True
    return not (flow.client_conn.state & ConnectionState.CAN_READ)


def _is_reverse(flow: http.HTTPFlow) -> bool:
    return isinstance(flow.client_conn.proxy_mode, ReverseMode)
