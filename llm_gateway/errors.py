"""Every status and code the gateway answers, once: the README's error table as data, and
a named constructor for each answer.

Bodies are OpenAI-shaped (``{"error": {"message", "type", "code"}}``), the one shape every
client SDK reads, so an SDK raises the exception an application already handles.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

Headers = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class ErrorKind:
    status: int
    type: str
    code: str
    when: str  # the README's words for it


# One row per code. tests/test_errors.py holds the README's table to these rows.
CATALOGUE: dict[str, ErrorKind] = {kind.code: kind for kind in (
    ErrorKind(400, "invalid_request_error", "invalid_json", "the body is not JSON"),
    ErrorKind(400, "invalid_request_error", "invalid_request_body",
              "`model`, `messages` or `stream` malformed"),
    ErrorKind(400, "invalid_request_error", "invalid_request_header",
              "a gateway request header malformed (`x-llm-gateway-tags`)"),
    ErrorKind(400, "invalid_request_error", "malformed_http",
              "what was sent is not an HTTP/1.1 request (the connection is then closed)"),
    ErrorKind(401, "authentication_error", "invalid_api_key",
              "key missing, malformed, unknown, revoked or expired"),
    ErrorKind(400, "invalid_request_error", "context_length_exceeded",
              "the prompt fits no target's context window (estimated before any call)"),
    ErrorKind(400, "invalid_request_error", "max_tokens_too_large",
              "`max_tokens` above the key's cap, when its budget says reject"),
    ErrorKind(400, "invalid_request_error", "model_not_priced",
              "a key or subject with a USD budget, and a target with no price and no cost "
              "of its provider's own (`unpriced: refuse`, the default; refused before the call)"),
    ErrorKind(400, "invalid_request_error", "unsupported_parameter",
              "a parameter the chosen provider cannot take (refused before the call)"),
    ErrorKind(400, "invalid_request_error", "unsupported_protocol",
              "no target of the model speaks the request's protocol (refused before the call)"),
    ErrorKind(403, "permission_error", "model_not_allowed", "model not allowed for the key"),
    ErrorKind(403, "permission_error", "endpoint_not_allowed",
              "a provider path the gateway does not forward (billing, account, keys)"),
    ErrorKind(403, "permission_error", "egress_denied",
              "sidecar, `EGRESS_POLICY=deny`: a host that is not an LLM host"),
    ErrorKind(403, "permission_error", "provider_not_configured",
              "sidecar: a known LLM host (`api.openai.com`...) that no configured provider "
              "serves; never tunnelled, under either egress policy"),
    ErrorKind(404, "invalid_request_error", "not_found", "a path the gateway does not serve"),
    ErrorKind(404, "invalid_request_error", "response_not_found",
              "a stored response (Responses API) that is not the caller's, or none"),
    ErrorKind(404, "invalid_request_error", "previous_response_not_found",
              "a `previous_response_id` that is not the caller's, or none"),
    ErrorKind(404, "invalid_request_error", "model_not_found",
              "a model that is no alias, with `unknown_models: reject`"),
    ErrorKind(405, "invalid_request_error", "method_not_allowed",
              "a method an admin or probe endpoint does not take"),
    ErrorKind(408, "invalid_request_error", "request_timeout",
              "the request's headers or body did not arrive within `HEADER_READ_TIMEOUT_SECONDS` "
              "or `BODY_READ_TIMEOUT_SECONDS` (the connection is then closed)"),
    ErrorKind(409, "invalid_request_error", "conflict",
              "admin API: the target's state forbids the change (a revoked key cannot be enabled)"),
    ErrorKind(409, "invalid_request_error", "not_configured",
              "admin API: the change needs a setting the gateway lacks (LLM_GATEWAY_SECRET_KEY)"),
    ErrorKind(413, "invalid_request_error", "request_too_large",
              "body over `REQUEST_BODY_LIMIT_BYTES`"),
    ErrorKind(431, "invalid_request_error", "request_header_fields_too_large",
              "request line and headers over `MAX_HEADER_BYTES` (the connection is then closed)"),
    ErrorKind(429, "rate_limit_error", "rate_limit_exceeded",
              "per-key rate limit (with `Retry-After`)"),
    ErrorKind(429, "insufficient_quota", "insufficient_quota",
              "over a USD or token budget (OpenAI's own shape, so SDKs raise RateLimitError)"),
    ErrorKind(429, "rate_limit_error", "too_many_failed_requests",
              "the key caused too many upstream 4xx failures lately (protects the shared key)"),
    ErrorKind(500, "server_error", "gateway_error",
              "the gateway itself failed on the request (in a stream: in band)"),
    ErrorKind(502, "upstream_error", "upstream_unreachable", "provider unreachable"),
    ErrorKind(502, "upstream_error", "upstream_broken_response", "its answer broke off"),
    ErrorKind(502, "upstream_error", "upstream_stream_interrupted",
              "a stream broke off (in band: the status was sent already)"),
    ErrorKind(502, "upstream_error", "upstream_response_too_large",
              "the answer is over `UPSTREAM_RESPONSE_LIMIT_BYTES` (in band for streams)"),
    ErrorKind(503, "service_unavailable", "no_available_upstream",
              "every target of the model is DOWN (passive health) or was tried"),
    ErrorKind(503, "service_unavailable", "stored_response_unavailable",
              "the target that stored a response (the only one that has it) is down"),
    ErrorKind(503, "service_unavailable", "upstream_overloaded",
              "every target's bulkhead (`max_concurrency`) is full"),
    ErrorKind(503, "service_unavailable", "key_store_unavailable",
              "key store (keys, budgets) unreachable, under `fail-closed` (with `Retry-After`)"),
    ErrorKind(503, "service_unavailable", "rate_limiter_unavailable",
              "shared limiter or budget counters unreachable, under `fail-closed` "
              "(with `Retry-After`)"),
    ErrorKind(503, "service_unavailable", "not_ready",
              "`/readyz`: the gateway cannot serve yet (or a backend is down under `fail-closed`)"),
    ErrorKind(504, "upstream_error", "upstream_timeout",
              "provider did not answer within `REQUEST_TIMEOUT_SECONDS`"),
)}


def error_body(message: str, type_: str, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


def error_body_for(code: str, message: str) -> bytes:
    kind = CATALOGUE[code]
    return error_body(message, kind.type, kind.code)


# How an answer's error is written: (status, type, code, message) to the body's bytes.
# OpenAI's is the default; each client protocol has its own (llm_gateway.protocols), set on
# a rejection once the engine knows whose request it answers.
ErrorShape = Callable[[int, str, str, str], bytes]


def openai_error(status: int, type_: str, code: str, message: str) -> bytes:
    return error_body(message, type_, code)


@dataclass(slots=True)
class Rejection:
    """A request the gateway answers itself; it never reaches an upstream. What it says
    (status, type, code, message) is the catalogue's; how the body is written is the
    caller's protocol's (``shape``)."""

    status: int
    code: str
    text: str
    headers: Headers = field(default_factory=list)
    type: str = "invalid_request_error"
    shape: ErrorShape = openai_error

    @property
    def body(self) -> bytes:
        return self.shape(self.status, self.type, self.code, self.text)

    def all_headers(self) -> Headers:
        return [("content-type", "application/json"), *self.headers]

    def message(self) -> str:
        return self.text


_RETRY_SHORTLY = [("retry-after", "1")]


def reject(code: str, message: str, headers: Headers | None = None) -> Rejection:
    kind = CATALOGUE[code]
    return Rejection(kind.status, code, message, headers or [], kind.type)


# ---- the named answers -----------------------------------------------------------------

def invalid_json() -> Rejection:
    return reject("invalid_json", "The request body is not valid JSON.")


def invalid_request_body(message: str) -> Rejection:
    return reject("invalid_request_body", message)


def invalid_request_header(message: str) -> Rejection:
    return reject("invalid_request_header", message)


def malformed_http() -> Rejection:
    return reject("malformed_http", "What was sent is not a valid HTTP/1.1 request.")


def invalid_api_key(message: str = "Invalid gateway key.", *, final: bool = False) -> Rejection:
    """``final``: the key exists but will not work again (revoked, disabled, expired)."""
    return reject("invalid_api_key", message, [FINAL] if final else None)


def model_not_allowed(model: str) -> Rejection:
    return reject("model_not_allowed", f"This gateway key may not use model '{model}'.")


def endpoint_not_allowed(method: str, path: str) -> Rejection:
    return reject("endpoint_not_allowed",
                  f"{method} {path} is not an endpoint this gateway serves.")


def egress_denied(host: str, port: int) -> Rejection:
    return reject(
        "egress_denied",
        f"Egress to {host}:{port} is not allowed: this pod may reach LLM providers only.",
    )


def provider_not_configured(host: str) -> Rejection:
    """``host``: a known LLM host's name (it matched the list, so it is a plain host name)."""
    return reject(
        "provider_not_configured",
        f"{host} is an LLM provider's host that no provider of this gateway serves: requests "
        f"to it are refused, never passed through ungoverned. Call a configured provider, or "
        f"configure one whose base_url is on {host}.",
    )


def not_found(method: str, path: str) -> Rejection:
    return reject("not_found", f"No route for {method} {path}.")


def model_not_found(model: str) -> Rejection:
    return reject("model_not_found", f"The model '{model}' does not exist on this gateway.")


def response_not_found(response_id: str) -> Rejection:
    """As the provider answers an id it does not know: another subject's is none of the
    caller's business, not even that it exists."""
    return reject("response_not_found", f"Response with id '{response_id}' not found.")


def previous_response_not_found(response_id: str) -> Rejection:
    return reject("previous_response_not_found",
                  f"Previous response with id '{response_id}' not found.")


def stored_response_unavailable(response_id: str, why: str) -> Rejection:
    return reject("stored_response_unavailable",
                  f"Response '{response_id}' is stored only where it was made, and {why}. "
                  "Retry shortly.", list(_RETRY_SHORTLY))


def context_length_exceeded(model: str, prompt_tokens: int) -> Rejection:
    return reject(
        "context_length_exceeded",
        f"The prompt (about {prompt_tokens} tokens) fits the context window of no "
        f"target of '{model}'.",
    )


def no_available_upstream(model: str) -> Rejection:
    return reject("no_available_upstream",
                  f"No upstream for '{model}' can take the request now. Retry shortly.",
                  list(_RETRY_SHORTLY))


def upstream_overloaded(model: str) -> Rejection:
    return reject("upstream_overloaded",
                  f"Every upstream for '{model}' is at its concurrency limit. Retry shortly.",
                  list(_RETRY_SHORTLY))


def too_many_failed_requests(limit: int, window: int) -> Rejection:
    return reject(
        "too_many_failed_requests",
        f"This gateway key caused {limit} failed upstream requests within {window}s; it is "
        "paused to protect the shared provider key. Fix the request and retry later.",
        [("retry-after", str(window))],
    )


# What tells both SDKs (openai, anthropic) not to retry what cannot succeed by retrying: a
# spent budget, a revoked, disabled or expired key.
FINAL = ("x-should-retry", "false")


def insufficient_quota(limit: str, headers: Headers) -> Rejection:
    what = {"usd": "USD budget", "tok": "token budget"}.get(limit.partition(":")[0], "budget")
    return reject(
        "insufficient_quota",
        f"This request would exceed the {what} of this gateway key or its subject "
        f"({limit.split(':', 1)[-1]}). It resets with its window.",
        [*headers, FINAL],
    )


def tokens_per_minute_exceeded(headers: Headers) -> Rejection:
    """``headers``: the bucket's token headers and its ``retry-after`` (1 s if none)."""
    waits = [] if any(name == "retry-after" for name, _ in headers) else [("retry-after", "1")]
    return reject("rate_limit_exceeded",
                  "Rate limit reached for this gateway key: tokens per minute. Retry shortly.",
                  [*headers, *waits])


def max_tokens_too_large(cap: int) -> Rejection:
    return reject("max_tokens_too_large",
                  f"max_tokens is above this key's cap of {cap} output tokens.")


def model_not_priced(provider: str, model: str) -> Rejection:
    return reject("model_not_priced",
                  f"The model '{model}' of provider '{provider}' has no price, and this key "
                  "has a USD budget: it cannot be held to it. Set a price (llm-gateway prices "
                  "set), or `unpriced: allow` on the provider or target.")


def unsupported_protocol(protocol: str, model: str) -> Rejection:
    return reject("unsupported_protocol",
                  f"No target of '{model}' speaks the {protocol} protocol this request uses.")


def unsupported_parameter(message: str) -> Rejection:
    return reject("unsupported_parameter", message)


def request_too_large(limit: int) -> Rejection:
    return reject("request_too_large",
                  f"Request body is larger than the gateway's limit of {limit} bytes.")


def request_timeout(part: str, seconds: float) -> Rejection:
    return reject("request_timeout",
                  f"The request's {part} did not arrive within {seconds:g} s.")


def request_header_fields_too_large(limit: int) -> Rejection:
    return reject("request_header_fields_too_large",
                  f"The request line and headers are larger than the gateway's limit of "
                  f"{limit} bytes.")


def rate_limit_exceeded(message: str, headers: Headers) -> Rejection:
    return reject("rate_limit_exceeded", message, headers)


def gateway_error(
    message: str = "The gateway failed while checking this request; it was not forwarded.",
) -> Rejection:
    return reject("gateway_error", message)


def key_store_unavailable() -> Rejection:
    return reject(
        "key_store_unavailable",
        "The gateway's key store is not reachable, so the key cannot be checked. Retry shortly.",
        list(_RETRY_SHORTLY),
    )


def budget_ledger_unavailable() -> Rejection:
    """The budget counters did not answer, under fail-closed: the limiter's code, for they
    are limits on the same backend and the client's remedy is the same."""
    return reject(
        "rate_limiter_unavailable",
        "The gateway's budget counters are not reachable, so the request cannot be held to "
        "its budget. Retry shortly.",
        list(_RETRY_SHORTLY),
    )


def rate_limiter_unavailable() -> Rejection:
    return reject(
        "rate_limiter_unavailable",
        "The gateway's rate limiter is not reachable, so the request cannot be counted "
        "against its limit. Retry shortly.",
        list(_RETRY_SHORTLY),
    )


class UpstreamFailure(Exception):
    """The upstream could not be reached, did not answer in time, or broke off."""

    def __init__(self, code: str, message: str, attempts: int = 1, *,
                 kind: str = "broken") -> None:
        super().__init__(message)
        self.code = code
        self.status = CATALOGUE[code].status
        self.attempts = attempts
        self.kind = kind  # what it says of the target: "connect", "timeout" or "broken"

    def body(self, shape: ErrorShape = openai_error) -> bytes:
        return shape(self.status, CATALOGUE[self.code].type, self.code, str(self))
