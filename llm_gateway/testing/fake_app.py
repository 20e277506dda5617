"""The fake upstream itself: a pure ASGI app that checks the key, records the request, applies
any queued fault and hands the request to its endpoint."""

import functools
import hmac
import re
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence

from llm_gateway.asgi_types import Message, Receive, Scope, Send, answer_lifespan
from llm_gateway.testing import (
    fake_anthropic,
    fake_anthropic_request,
    fake_endpoints,
    fake_gemini,
    fake_reports,
    fake_responses,
)
from llm_gateway.testing.fake_content import (
    DEFAULT_FAKE_ADMIN_KEY,
    DEFAULT_FAKE_API_KEY,
    billing_payload,
    fake_id,
)
from llm_gateway.testing.fake_errors import error_payload, gemini_error
from llm_gateway.testing.fake_exchange import (
    ClientPresence,
    Exchange,
    RecordedRequest,
    header_dict,
    parse_json,
    read_body,
    send_fault_status,
    send_json,
)
from llm_gateway.testing.fake_faults import (
    Fault,
    FaultQueue,
    hide_deliberate_cut_tracebacks,
    uncapped,
)
from llm_gateway.testing.fake_ledger import ServedLedger
from llm_gateway.testing.fake_responses_store import ResponseStore

USAGE_MODES = ("venice", "openai", "anthropic", "gemini")
# Where each imitated API lives: https://api.venice.ai/api/v1, https://api.openai.com/v1 (the
# fake's openai mode has always defaulted to Venice's prefix) and https://api.anthropic.com/v1.
_DEFAULT_PREFIXES = {"venice": "/api/v1", "openai": "/api/v1", "anthropic": "/v1",
                     "gemini": "/v1beta"}
# Gemini's methods on a model (``/models/{model}:{method}``), all POST.
_GEMINI_METHODS = {"countTokens": fake_gemini.count, "embedContent": fake_gemini.embed,
                   "batchEmbedContents": fake_gemini.batch_embed}

# One endpoint's answer to one exchange (its fault applied), by method.
Handler = Callable[[Exchange, Fault | None], Awaitable[None]]

# An HTTP field name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class FakeUpstream:
    """An OpenAI/Venice/Anthropic-compatible upstream as a pure ASGI app.

    ``usage_mode`` selects the provider being imitated: "venice" always sends a usage chunk in
    streams and adds ``usage.cost``; "openai" sends stream usage only when the request asked for
    it with ``stream_options.include_usage`` and never adds cost, and also serves OpenAI's
    Responses API (:mod:`fake_responses`); "anthropic" serves Anthropic's Messages API instead
    (:mod:`fake_anthropic`: messages, count_tokens, models) and nothing of OpenAI's. The mode
    also picks the shape of the fake's own errors (401, 400, 404, 405) and the fields accepted:
    like the real APIs, every mode refuses a request with a top-level field that provider does
    not document, unless ``strict_fields=False``. Injected faults choose their error shape with
    ``Fault.shape`` (by default Anthropic's in anthropic mode, else Venice's).

    ``api_prefix`` defaults to the imitated API's: ``/api/v1`` (venice, openai) or ``/v1``
    (anthropic; the anthropic SDK wants the origin as its ``base_url``, since it adds ``/v1``).

    ``auth_header`` is where the key is expected: "authorization" (``Bearer <key>``), or another
    header carrying the bare key, as Azure's ``api-key``. Anthropic mode ignores it and does as
    Anthropic: ``x-api-key: <key>``, else ``Authorization: Bearer <key>`` (what its SDK sends
    since API version 2026-10-21); with both, ``x-api-key`` counts. It also requires
    ``anthropic-version``. ``extra_api_keys`` are accepted as well as ``api_key``, each with a
    Responses store of its own, as OpenAI keeps projects apart.

    ``ledger`` (default: as ``record``) keeps every billed request it answers
    (:mod:`fake_ledger`); its usage and cost report APIs (:mod:`fake_reports`), which take
    ``admin_key`` only, bill from it, skewed by ``billing_skew`` requests (+1: one request
    over-billed; -1: one under-billed; ``ledger.skew`` changes it at run time).
    """

    def __init__(
        self,
        api_key: str = DEFAULT_FAKE_API_KEY,
        *,
        api_prefix: str | None = None,
        usage_mode: str = "venice",
        chunk_count: int = 8,
        chunk_delay: float = 0.0,
        record: bool = True,
        auth_header: str = "authorization",
        strict_fields: bool = True,
        extra_api_keys: Sequence[str] = (),
        admin_key: str = DEFAULT_FAKE_ADMIN_KEY,
        ledger: bool | None = None,
        billing_skew: int = 0,
    ) -> None:
        if usage_mode not in USAGE_MODES:
            raise ValueError(f"usage_mode must be one of {USAGE_MODES}, not {usage_mode!r}")
        if chunk_count < 0 or chunk_delay < 0:
            raise ValueError("chunk_count and chunk_delay must not be negative")
        if not _HEADER_NAME.fullmatch(auth_header):
            raise ValueError(f"auth_header must be an HTTP header name, not {auth_header!r}")
        self.api_key = api_key
        self.api_keys = (api_key, *extra_api_keys)
        self.admin_keys = (admin_key,)
        if api_prefix is None:
            api_prefix = _DEFAULT_PREFIXES[usage_mode]
        # Normalised to "/x/y" (or "" for the root) so prefix matching is a plain string test.
        self.api_prefix = "/" + api_prefix.strip("/") if api_prefix.strip("/") else ""
        self.usage_mode = usage_mode
        self.chunk_count = chunk_count
        self.chunk_delay = chunk_delay
        self.record = record
        self.auth_header = auth_header.lower()  # header names are case-insensitive
        self.strict_fields = strict_fields
        self.requests: list[RecordedRequest] = []
        self.connections = 0  # incremented by the runner's protocol on every accepted connection
        # Requests being answered now, and the most at once since the last reset: what a
        # bulkhead in front of the fake must keep under its limit.
        self.in_flight = 0
        self.max_in_flight = 0
        # Anthropic refuses bodies over 32 MB (413 request_too_large); tests may lower it.
        self.max_request_bytes: int | None = (
            fake_anthropic_request.MAX_REQUEST_BYTES if usage_mode == "anthropic" else None)
        # Stored Responses (openai mode), per API key.
        self.response_store = ResponseStore()
        self.ledger = ServedLedger(usage_mode, skew=billing_skew)
        self._keeps_ledger = record if ledger is None else ledger
        self._faults = FaultQueue()
        hide_deliberate_cut_tracebacks()

    # -- test controls --

    def push_fault(self, fault: Fault) -> None:
        self._faults.push(fault)

    @property
    def pending_faults(self) -> list[Fault]:
        """Faults not yet used up, in the order they will be applied."""
        return self._faults.pending()

    def reset(self) -> None:
        self._faults.clear()
        self.requests.clear()
        self.response_store.clear()
        self.ledger.clear()
        self.connections = 0
        self.max_in_flight = self.in_flight

    # -- ASGI entry point --

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._handle_non_http(scope, receive, send)
            return
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._answer(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        anthropic = self.usage_mode == "anthropic"
        # Anthropic calls it request-id (req_011…), OpenAI and Venice x-request-id.
        request_id = fake_id("req_011", 21) if anthropic else f"req_fake{secrets.token_hex(8)}"
        send = _with_request_id(send, "request-id" if anthropic else "x-request-id", request_id)
        body = await read_body(receive)
        headers = header_dict(scope["headers"])
        body_json = parse_json(body)
        method: str = scope["method"]
        path: str = scope["path"]
        query: str = scope.get("query_string", b"").decode("latin-1")
        recorded: RecordedRequest | None = None
        if self.record:
            # Before any check, so a test can see what a refused request carried too.
            recorded = RecordedRequest(
                method, path, query, headers, body, body_json, received_at=time.monotonic()
            )
            self.requests.append(recorded)
            send = _recording(send, recorded.sent)
        api_key = await self._admitted(send, path, headers, body, request_id, query)
        if api_key is None:
            return
        fault = self._faults.take(path) if self._faults else None
        if fault is not None and fault.ignore_output_cap:
            body_json = uncapped(body_json, self.usage_mode)
        endpoint = path[len(self.api_prefix) :]
        watch = (self.ledger.watch(send)
                 if self._keeps_ledger and self.ledger.bills(method, endpoint) else None)
        send = watch.send if watch is not None else send
        exchange = Exchange(
            method=method,
            path=path,
            query=query,
            headers=headers,
            body_json=body_json,
            send=send,
            presence=ClientPresence(receive),
            recorded=recorded,
            provider=self.usage_mode,
            request_id=request_id,
            api_key=api_key,
        )
        try:
            await self._answer_admitted(exchange, endpoint, fault)
        finally:
            exchange.presence.stop()
            if watch is not None:
                watch.finish()

    async def _admitted(self, send: Send, path: str, headers: dict[str, str], body: bytes,
                        request_id: str, query: str = "") -> str | None:
        """The key a request under the prefix authenticated with, or None after the provider's
        refusal: 404 outside the prefix, 413 for a body over the limit, 401, and in anthropic
        mode 400 for a missing or unknown ``anthropic-version``."""
        prefix = self.api_prefix
        if path != prefix and not path.startswith(prefix + "/"):
            await send_json(send, 404, error_payload(self.usage_mode, 404, "Not found",
                                                     request_id=request_id))
            return None
        if self.max_request_bytes is not None and len(body) > self.max_request_bytes:
            payload = error_payload(self.usage_mode, 413,
                                    "Request exceeds the maximum allowed number of bytes.",
                                    request_id=request_id)
            await send_json(send, 413, payload)
            return None
        # A report API takes the admin key only, an inference endpoint never takes it.
        admin = fake_reports.is_report(self.usage_mode, path[len(prefix) :])
        api_key = self._authenticated(headers, query, self.admin_keys if admin else None)
        if api_key is None:
            await self._send_unauthorized(send, headers, request_id, query)
            return None
        if self.usage_mode == "anthropic" \
                and (problem := fake_anthropic_request.version_problem(headers)) is not None:
            await send_json(send, 400, error_payload("anthropic", 400, problem,
                                                     request_id=request_id))
            return None
        return api_key

    async def _answer_admitted(self, exchange: Exchange, endpoint: str,
                               fault: Fault | None) -> None:
        """The endpoint's answer, after the fault's delay; or the fault's error instead."""
        if fault is not None:
            if fault.delay > 0 and not await exchange.wait(fault.delay):
                return
            if fault.status is not None:
                await send_fault_status(exchange.send, fault, self.usage_mode,
                                        exchange.request_id)
                return
        await self._route(exchange, endpoint, fault)

    def _presented_key(self, headers: dict[str, str], query: str = "") -> str | None:
        if self.usage_mode == "gemini":
            # Google takes the key in x-goog-api-key or as ?key= (its SDKs send the header).
            keys = urllib.parse.parse_qs(query).get("key")
            return headers.get("x-goog-api-key") or (keys[0] if keys else None)
        header = self.auth_header
        if self.usage_mode == "anthropic":
            header = "x-api-key" if "x-api-key" in headers else "authorization"
        presented = headers.get(header)
        if presented is None:
            return None
        if header == "authorization":
            # The scheme is case-insensitive (RFC 9110 section 11.1); the key is not.
            scheme, _, presented = presented.partition(" ")
            if scheme.lower() != "bearer":
                return None
        return presented

    def _authenticated(self, headers: dict[str, str], query: str = "",
                       keys: Sequence[str] | None = None) -> str | None:
        """The key the request authenticated with (of ``keys``, default the API keys)."""
        presented = self._presented_key(headers, query)
        if presented is None:
            return None
        # Constant time, as a real provider compares secrets, and against every key (no early
        # exit tells which one matched). Header values arrive as latin-1.
        matched = None
        for key in self.api_keys if keys is None else keys:
            if hmac.compare_digest(presented.encode("latin-1"), key.encode()):
                matched = key
        return matched

    async def _handle_non_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _send_unauthorized(self, send: Send, headers: dict[str, str],
                                 request_id: str, query: str = "") -> None:
        if self.usage_mode == "gemini":
            await _send_gemini_unauthorized(send, headers, self._presented_key(headers, query))
            return
        if self.usage_mode == "anthropic":
            # Anthropic's words for a missing key and for a wrong one.
            message = ("x-api-key header is required"
                       if self._presented_key(headers) is None else "invalid x-api-key")
        elif self.usage_mode == "openai":
            message = "Incorrect API key provided."
        else:
            message = "Authentication failed"
        await send_json(send, 401, error_payload(self.usage_mode, 401, message,
                                                 request_id=request_id))

    async def _route(self, exchange: Exchange, endpoint: str, fault: Fault | None) -> None:
        handlers = self._handlers(endpoint)
        if handlers is None:
            await exchange.send_success(billing_payload(), fault)
        elif exchange.method not in handlers:
            allowed = ", ".join(handlers)
            payload = error_payload(self.usage_mode, 405, "Method not allowed",
                                    request_id=exchange.request_id)
            await send_json(exchange.send, 405, payload, [("allow", allowed)])
        else:
            await handlers[exchange.method](exchange, fault)

    def _handlers(self, endpoint: str) -> dict[str, Handler] | None:
        """What the imitated provider serves at ``endpoint`` (relative to the prefix), by
        method; None for every other path (the "billing" ones)."""
        reports = fake_reports.handlers(self.usage_mode, endpoint, self.ledger)
        if reports is not None:
            return reports
        stream = {"chunk_count": self.chunk_count, "chunk_delay": self.chunk_delay,
                  "strict_fields": self.strict_fields}
        strict = {"strict_fields": self.strict_fields}
        if self.usage_mode == "anthropic":
            if endpoint == "/messages":
                return {"POST": functools.partial(fake_anthropic.messages, **stream)}
            if endpoint == "/messages/count_tokens":
                return {"POST": functools.partial(fake_anthropic.count_tokens, **strict)}
            if endpoint == "/models":
                return {"GET": fake_anthropic.list_models}
            model_id = _path_id(endpoint, "/models/")
            if model_id is not None:
                return {"GET": _with_id(fake_anthropic.get_model, model_id)}
            return None
        if self.usage_mode == "gemini":
            return _gemini_handlers(endpoint, stream)
        if endpoint == "/chat/completions":
            return {"POST": functools.partial(fake_endpoints.chat_completions, **stream)}
        if endpoint == "/embeddings":
            return {"POST": fake_endpoints.embeddings}
        if endpoint == "/models":
            return {"GET": fake_endpoints.models}
        if self.usage_mode == "openai":
            return self._responses_handlers(endpoint, stream, strict)
        return None

    def _responses_handlers(self, endpoint: str, stream: dict[str, object],
                            strict: dict[str, object]) -> dict[str, Handler] | None:
        store = self.response_store
        if endpoint == "/responses":
            return {"POST": _with_store(fake_responses.create, store, **stream)}
        if endpoint == "/responses/input_tokens":
            return {"POST": _with_store(fake_responses.input_tokens, store, **strict)}
        if endpoint == "/responses/compact":
            return {"POST": _with_store(fake_responses.compact, store, **strict)}
        response_id = _path_id(endpoint, "/responses/")
        if response_id is not None:
            return {"GET": _with_store(fake_responses.retrieve, store, response_id),
                    "DELETE": _with_store(fake_responses.delete, store, response_id)}
        for action, method, handler in (
                ("cancel", "POST", fake_responses.cancel),
                ("input_items", "GET", fake_responses.input_items)):
            if endpoint.endswith("/" + action):
                response_id = _path_id(endpoint.removesuffix("/" + action), "/responses/")
                if response_id is not None:
                    return {method: _with_store(handler, store, response_id)}
        return None


def _gemini_handlers(endpoint: str, stream: dict[str, object]) -> dict[str, Handler] | None:
    """Gemini's: the model list, a model, and a model's methods (``/models/{model}:{method}``)."""
    if endpoint == "/models":
        return {"GET": fake_gemini.list_models}
    named = _path_id(endpoint, "/models/")
    if named is None:
        return None
    model, colon, method = named.rpartition(":")
    if not colon:
        return {"GET": _with_id(fake_gemini.get_model, named)}
    if method in ("generateContent", "streamGenerateContent"):
        generate = functools.partial(fake_gemini.generate, stream=method != "generateContent",
                                     **stream)
        return {"POST": _with_id(generate, model)}
    handler = _GEMINI_METHODS.get(method)
    return {"POST": _with_id(handler, model)} if handler is not None else None


async def _send_gemini_unauthorized(send: Send, headers: dict[str, str],
                                    presented: str | None) -> None:
    """As Google answers: a wrong key is a 400 (API_KEY_INVALID), none a 403; a bearer
    token (OAuth, which the fake cannot check) a 401."""
    if presented is not None:
        payload = gemini_error(400, "API key not valid. Please pass a valid API key.",
                               "API_KEY_INVALID")
    elif headers.get("authorization", "").lower().startswith("bearer "):
        payload = gemini_error(401, "Request had invalid authentication credentials. "
                               "Expected OAuth 2 access token, login cookie or other valid "
                               "authentication credential.")
    else:
        payload = gemini_error(403, "Method doesn't allow unregistered callers (callers "
                               "without established identity). Please use API Key or other "
                               "form of API consumer identity to call this API.")
    status = payload["error"]["code"]  # type: ignore[index]
    await send_json(send, status, payload)


def _path_id(endpoint: str, collection: str) -> str | None:
    """The id in ``<collection><id>`` (one non-empty path segment), or None."""
    if not endpoint.startswith(collection):
        return None
    identifier = endpoint.removeprefix(collection)
    return identifier if identifier and "/" not in identifier else None


def _with_id(handler: Callable[..., Awaitable[None]], identifier: str) -> Handler:
    async def handle(exchange: Exchange, fault: Fault | None) -> None:
        await handler(exchange, fault, identifier)

    return handle


def _with_store(handler: Callable[..., Awaitable[None]], store: ResponseStore,
                *args: object, **options: object) -> Handler:
    async def handle(exchange: Exchange, fault: Fault | None) -> None:
        await handler(exchange, fault, store, *args, **options)

    return handle


def _with_request_id(send: Send, header: str, request_id: str) -> Send:
    """``send``, with the provider's own request id on every answer, as OpenAI (and most
    OpenAI-compatible servers) send ``x-request-id`` and Anthropic ``request-id``: a gateway
    must not pass it off as its own."""
    name_bytes = header.encode()
    value = request_id.encode()

    async def identified_send(message: Message) -> None:
        headers = message.get("headers", [])
        if message["type"] == "http.response.start" and not any(
                name.lower() == name_bytes for name, _ in headers):  # a fault's own wins
            message = {**message, "headers": [*headers, (name_bytes, value)]}
        await send(message)

    return identified_send


def _recording(send: Send, sent: bytearray) -> Send:
    """``send``, keeping a copy of every body byte: what a test compares a relay with."""

    async def recording_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.extend(message.get("body", b""))
        await send(message)

    return recording_send
