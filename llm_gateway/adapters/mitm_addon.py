"""The gateway as a mitmproxy addon: the mitmproxy twin of the ASGI adapter.

It translates flows into the engine's ``IncomingRequest`` and the engine's answers back
into flows; every rule (which hosts are LLM hosts, which paths may be forwarded, keys,
limits, the provider key, the egress policy, retries, timeouts, error bodies) is the
engine's. Who sends depends on the request:

- not a stream: the engine sends (``Exchange.respond``: its pooled client, retries,
  timeouts, OpenAI-shaped 502/504s) and the addon sets the answer as ``flow.response``;
  mitmproxy then opens no upstream connection for the flow.
- a stream (``"stream": true``): mitmproxy forwards, relaying each chunk as it arrives,
  and the engine names the upstream and its headers and observes what comes back.

For a request to an LLM host the hooks run in this order::

    http_connect     (CONNECT, regular mode) egress policy for the other hosts
    requestheaders   is it an LLM host? keep its body buffered; refuse an oversized one
    request          admit: answer the rejection; the engine's answer (not a stream);
                     or rewrite to the engine's upstream (a stream)
    responseheaders  forwarded: the status and headers the engine gives the client
    response         forwarded: observe a whole body; finish
    error            finish (client gone, upstream gone)

Fail closed. mitmproxy runs each hook inside a safe-call wrapper that logs an exception
and lets the flow continue, unchanged: an exception after the gateway key was checked
would forward the caller's request, gateway key and all, to the host it named. So every
hook catches everything and answers with an error of its own, or kills the flow when the
response has started; nothing reaches a provider unless the engine admitted it.

mitmproxy must connect lazily (``connection_strategy=lazy``: a rejected request never
opens a connection, not even TCP) and must not sniff upstream certificates
(``upstream_cert=false``); ``configure`` enforces both, and ``allow_hosts``, which keeps
every other host's TLS untouched.
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
from mitmproxy.net import encoding
from mitmproxy.net.http import url as mitm_url
from mitmproxy.proxy.mode_specs import ReverseMode

from llm_gateway import errors
from llm_gateway.adapters.mitm_stream import IncrementalDecoder, SseRelay, stream_framing
from llm_gateway.config import ConfigError, load_settings
from llm_gateway.engine import Gateway
from llm_gateway.errors import Rejection
from llm_gateway.exchange import Exchange
from llm_gateway.messages import IncomingRequest
from llm_gateway.wiring import build_gateway

log = logging.getLogger("llm_gateway.sidecar")

ADAPTER_NAME = "sidecar"
# Where a flow's gateway state lives: on the flow, so it goes when mitmproxy drops it.
_STATE_KEY = "llm_gateway"
_IDENTITY_ENCODINGS = frozenset({"", "identity", "none"})
# mitmproxy's message when the client side of a connection closed.
_CLIENT_DISCONNECTED = "Client disconnected."
# How often a request the engine is sending checks that its client is still there.
_DISCONNECT_POLL_SECONDS = 0.1


@dataclass(slots=True)
class _LlmFlow:
    """What the addon knows about a flow to an LLM host."""

    api_root: str
    exchange: Exchange | None = None
    # True once the request was rewritten to the engine's upstream: only then is the
    # response the provider's as mitmproxy received it, to be relayed and observed.
    forwarded: bool = False
    content_encoding: str | None = None  # the upstream's, for a buffered body
    # What the client gets for a buffered body, applied once the body is complete.
    client_headers: list[tuple[str, str]] | None = None


class GatewayAddon:
    """mitmproxy addon: gateway keys, limits, routing and metering on LLM traffic.

    ``llm-gateway sidecar`` passes the engine it built; under ``mitmdump -s`` the addon
    builds one from the environment (and the ``llm_gateway_config`` option).
    """

    def __init__(self, gateway: Gateway | None = None) -> None:
        self._gateway = gateway
        # Admitted and not yet finished: finished at shutdown if mitmproxy never says how
        # they ended. Removed at finish, so it holds only requests in flight.
        self._in_flight: set[Exchange] = set()

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
        required = self._required_options()
        changed = {
            name: value for name, value in required.items()
            if getattr(ctx.options, name) != value
        }
        if changed:
            ctx.options.update(**changed)

    def _required_options(self) -> dict[str, Any]:
        reverse_only = bool(ctx.options.mode) and all(
            spec.startswith("reverse") for spec in ctx.options.mode
        )
        return {
            # A rejected request must not open even a TCP connection to the provider, and
            # CONNECT api.venice.ai must not be answered by connecting there first.
            "connection_strategy": "lazy",
            "upstream_cert": False,
            # TLS is intercepted for the LLM hosts only; every other host keeps its own
            # certificate. A reverse proxy serves nothing but the gateway.
            "allow_hosts": [] if reverse_only else self._allow_host_patterns(),
        }

    def _allow_host_patterns(self) -> list[str]:
        """The engine's LLM hosts as mitmproxy patterns, which match "host:port"."""
        patterns = []
        for host in sorted(self.engine().llm_host_roots):
            name, _, port = host.rpartition(":") if _has_port(host) else (host, "", "")
            port_pattern = port or r"\d+"  # a host without a port: any port
            patterns.append(f"^{re.escape(name)}:{port_pattern}$")
        return patterns

    async def running(self) -> None:
        await self.engine().start()

    async def done(self) -> None:
        for exchange in list(self._in_flight):
            exchange.fail(503, "gateway_shutdown")
            self._finish(exchange)
        await self.engine().close()

    # ---- requests -----------------------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A CONNECT to a host that is not an LLM host: the egress policy decides."""
        try:
            host, port = flow.request.host, flow.request.port
            if self.engine().api_root_for_host(host, port) is not None:
                return
            rejection = self.engine().egress_rejection(host, port)
            if rejection is not None:
                _answer(flow, rejection)
        except Exception:
            log.exception("llm-gateway: CONNECT failed; refusing the tunnel")
            _answer_failure(flow)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            api_root = self._api_root(flow)
            if api_root is None:
                # Plain HTTP to another host (TLS to one is never intercepted).
                rejection = self.engine().egress_rejection(flow.request.host, flow.request.port)
                if rejection is not None:
                    _answer(flow, rejection)
                return
            flow.metadata[_STATE_KEY] = _LlmFlow(api_root)
            # Buffered, whatever stream_large_bodies says: no byte goes upstream before
            # the engine admitted the request.
            flow.request.stream = False
            declared = flow.request.headers.get("content-length", "")
            limit = self.engine().settings.request_body_limit_bytes
            if declared.isdigit() and int(declared) > limit:
                _answer(flow, self.engine().body_too_large())
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
                    return  # another host
                state = flow.metadata[_STATE_KEY] = _LlmFlow(api_root)
            await self._admit(flow, state)
        except Exception:
            log.exception("llm-gateway: request failed; answering 500, nothing forwarded")
            if isinstance(state, _LlmFlow):
                if state.exchange is not None:
                    state.exchange.fail(500, "gateway_error")
                    self._finish(state.exchange)
                state.forwarded = False
            _answer_failure(flow)

    async def _admit(self, flow: http.HTTPFlow, state: _LlmFlow) -> None:
        request = flow.request
        path, _, query = request.path.partition("?")
        relative = self.engine().path_under_root(state.api_root, path)
        if relative is None:
            _answer(flow, errors.endpoint_not_allowed(request.method, path))
            return
        body = request.raw_content or b""
        admitted = await self.engine().admit(IncomingRequest(
            method=request.method, path=relative,
            headers=[(name.lower(), value) for name, value in request.headers.items(multi=True)],
            body=body, adapter=ADAPTER_NAME, query=query,
        ))
        if isinstance(admitted, Rejection):
            _answer(flow, admitted)
            return
        state.exchange = admitted
        self._in_flight.add(admitted)
        if not admitted.stream:
            await self._respond(flow, admitted)
            return
        # Everything is computed before the flow changes, so a failure part-way leaves
        # the caller's request as it was, for the error answer to replace.
        upstream_url = admitted.upstream_url()
        upstream_headers = admitted.upstream_headers()
        upstream_headers.append(("content-length", str(len(body))))  # a stream: a POST
        request.url = upstream_url
        request.headers = _mitm_headers(upstream_headers)
        request.host_header = mitm_url.hostport(request.scheme, request.host, request.port)
        state.forwarded = True

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
        chunks = None
        try:
            response = await self.engine().respond(exchange)
            body, chunks = response.body, response.chunks
            if chunks is not None:
                # A stream the caller did not ask for: read whole, through the observer.
                body = b"".join([chunk async for chunk in chunks])
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            self._finish(exchange, client_disconnected=True)
            _kill(flow)
            return
        finally:
            timer.cancel()
            if chunks is not None:
                await chunks.aclose()  # type: ignore[attr-defined]
        flow.response = http.Response.make(
            response.status, body,
            _mitm_headers([*response.headers, ("content-length", str(len(body)))]),
        )

    def _api_root(self, flow: http.HTTPFlow) -> str | None:
        """The API root of the flow's LLM host; None when it goes to another host."""
        if isinstance(flow.client_conn.proxy_mode, ReverseMode):
            # A reverse proxy is the gateway's base URL: the same root as the ASGI app's.
            return self.engine().settings.api_prefix
        return self.engine().api_root_for_host(flow.request.host, flow.request.port)

    # ---- responses ----------------------------------------------------------------

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = _forwarded(flow)
        if state is None or state.exchange is None or flow.response is None:
            return
        exchange, response = state.exchange, flow.response
        try:
            content_encoding = response.headers.get("content-encoding", "").strip().lower()
            client_headers = exchange.on_response_start(
                response.status_code, response.headers.items(multi=True)
            )
            if exchange.is_sse:
                identity = content_encoding in _IDENTITY_ENCODINGS
                decoder = None if identity else IncrementalDecoder.for_encoding(content_encoding)
                if not identity and decoder is None:
                    # An encoding this adapter cannot undo: relay it as it is, labelled.
                    client_headers.append(("content-encoding", content_encoding))
                client_headers.extend(
                    stream_framing(response.headers, decoded=decoder is not None)
                )
                response.stream = SseRelay(exchange, decoder)
                # Sent now, as the stream starts.
                response.headers = _mitm_headers(client_headers)
            else:
                # A whole body is observed once and may be rewritten (errors, /models).
                response.stream = False
                state.content_encoding = content_encoding or None
                # Applied in `response`: until the body is complete, mitmproxy's upstream
                # connection reads the framing (content-length...) from these very headers
                # to decide whether it can be kept for the next request.
                state.client_headers = client_headers
        except Exception:
            log.exception("llm-gateway: responseheaders failed; killing the flow")
            exchange.fail(502, "gateway_error")
            self._finish(exchange)
            _kill(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_STATE_KEY)
        if not isinstance(state, _LlmFlow) or state.exchange is None or flow.response is None:
            return
        exchange, response = state.exchange, flow.response
        if not state.forwarded:
            self._finish(exchange)  # the engine's own answer, observed as it was made
            return
        try:
            if not exchange.is_sse:
                raw = response.raw_content or b""
                if state.content_encoding:
                    raw = encoding.decode(raw, state.content_encoding)
                body = exchange.complete_body(bytes(raw))
                response.headers = _mitm_headers(
                    [*(state.client_headers or []), ("content-length", str(len(body)))]
                )
                response.raw_content = body
            self._finish(exchange)
        except Exception:
            log.exception("llm-gateway: response failed; answering 502")
            exchange.fail(502, "gateway_error")
            self._finish(exchange)
            if not exchange.is_sse:  # a streamed body went out already
                _answer_failure(flow, status=502)

    def error(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(_STATE_KEY)
        if not isinstance(state, _LlmFlow) or state.exchange is None:
            return
        exchange = state.exchange
        try:
            if _client_gone(flow):
                self._finish(exchange, client_disconnected=True)
                return
            if not state.forwarded:
                self._finish(exchange)  # the engine answered: it failed, if at all, itself
                return
            if flow.response is None:
                exchange.fail(502, "upstream_unreachable")
            elif exchange.is_sse:
                exchange.fail(502, "upstream_stream_interrupted")
            else:
                exchange.fail(502, "upstream_broken_response")
            self._finish(exchange)
        except Exception:
            log.exception("llm-gateway: error hook failed")

    def _finish(self, exchange: Exchange, *, client_disconnected: bool = False) -> None:
        self._in_flight.discard(exchange)
        exchange.finish(client_disconnected=client_disconnected)


# ---- translation helpers ---------------------------------------------------------------


def _forwarded(flow: http.HTTPFlow) -> _LlmFlow | None:
    state = flow.metadata.get(_STATE_KEY)
    return state if isinstance(state, _LlmFlow) and state.forwarded else None


def _mitm_headers(headers: Iterable[tuple[str, str]]) -> http.Headers:
    # mitmproxy decodes header bytes as UTF-8 with surrogateescape: the same way back.
    return http.Headers([
        (name.encode("utf-8", "surrogateescape"), value.encode("utf-8", "surrogateescape"))
        for name, value in headers
    ])


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


def _has_port(host: str) -> bool:
    name, sep, port = host.rpartition(":")
    return bool(sep and name and port.isdigit())
