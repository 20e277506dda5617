"""Every status and code the gateway answers, once: the README's error table as data, and
a named constructor for each answer.

Bodies are OpenAI-shaped (``{"error": {"message", "type", "code"}}``), the one shape every
client SDK reads, so an SDK raises the exception an application already handles.
"""

from __future__ import annotations

import json
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
    ErrorKind(401, "authentication_error", "invalid_api_key",
              "key missing, malformed, unknown, revoked or expired"),
    ErrorKind(403, "permission_error", "model_not_allowed", "model not allowed for the key"),
    ErrorKind(403, "permission_error", "endpoint_not_allowed",
              "a provider path the gateway does not forward (billing, account, keys)"),
    ErrorKind(403, "permission_error", "egress_denied",
              "sidecar, `EGRESS_POLICY=deny`: a host that is not an LLM host"),
    ErrorKind(404, "invalid_request_error", "not_found", "a path the gateway does not serve"),
    ErrorKind(405, "invalid_request_error", "method_not_allowed",
              "a method an admin or probe endpoint does not take"),
    ErrorKind(413, "invalid_request_error", "request_too_large",
              "body over `REQUEST_BODY_LIMIT_BYTES`"),
    ErrorKind(429, "rate_limit_error", "rate_limit_exceeded",
              "per-key rate limit (with `Retry-After`)"),
    ErrorKind(500, "server_error", "gateway_error",
              "the gateway failed on the request; it was not forwarded"),
    ErrorKind(502, "upstream_error", "upstream_unreachable", "provider unreachable"),
    ErrorKind(502, "upstream_error", "upstream_broken_response", "its answer broke off"),
    ErrorKind(502, "upstream_error", "upstream_stream_interrupted",
              "a stream broke off (in band: the status was sent already)"),
    ErrorKind(503, "service_unavailable", "key_store_unavailable",
              "key store unreachable, under `fail-closed` (with `Retry-After`)"),
    ErrorKind(503, "service_unavailable", "rate_limiter_unavailable",
              "shared limiter unreachable, under `fail-closed` (with `Retry-After`)"),
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


@dataclass(slots=True)
class Rejection:
    """A request the gateway answers itself; it never reaches an upstream."""

    status: int
    body: bytes
    headers: Headers = field(default_factory=list)
    code: str = ""

    def all_headers(self) -> Headers:
        return [("content-type", "application/json"), *self.headers]


def reject(code: str, message: str, headers: Headers | None = None) -> Rejection:
    kind = CATALOGUE[code]
    return Rejection(kind.status, error_body(message, kind.type, code), headers or [], code)


_RETRY_SHORTLY = [("retry-after", "1")]


# ---- the named answers -----------------------------------------------------------------

def invalid_json() -> Rejection:
    return reject("invalid_json", "The request body is not valid JSON.")


def invalid_request_body(message: str) -> Rejection:
    return reject("invalid_request_body", message)


def invalid_api_key(message: str = "Invalid gateway key.") -> Rejection:
    return reject("invalid_api_key", message)


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


def not_found(method: str, path: str) -> Rejection:
    return reject("not_found", f"No route for {method} {path}.")


def request_too_large(limit: int) -> Rejection:
    return reject("request_too_large",
                  f"Request body is larger than the gateway's limit of {limit} bytes.")


def rate_limit_exceeded(message: str, headers: Headers) -> Rejection:
    return reject("rate_limit_exceeded", message, headers)


def gateway_error() -> Rejection:
    return reject("gateway_error",
                  "The gateway failed while checking this request; it was not forwarded.")


def key_store_unavailable() -> Rejection:
    return reject(
        "key_store_unavailable",
        "The gateway's key store is not reachable, so the key cannot be checked. Retry shortly.",
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

    def __init__(self, code: str, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.status = CATALOGUE[code].status
        self.attempts = attempts

    def body(self) -> bytes:
        return error_body_for(self.code, str(self))
