"""OpenAI-style error bodies, the one shape every client SDK knows how to read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

Headers = list[tuple[str, str]]


def error_body(message: str, type_: str, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "code": code}}).encode()


@dataclass(slots=True)
class Rejection:
    """A request the gateway answers itself; it never reaches an upstream."""

    status: int
    body: bytes
    headers: Headers = field(default_factory=list)
    error_type: str = ""

    def all_headers(self) -> Headers:
        return [("content-type", "application/json"), *self.headers]


def reject(
    status: int, message: str, type_: str, code: str | None, headers: Headers | None = None
) -> Rejection:
    return Rejection(status, error_body(message, type_, code), headers or [], code or type_)


def normalise_upstream_error(body: bytes, status: int) -> bytes:
    """Give an upstream error OpenAI's shape, keeping the provider's own message verbatim.

    A body already in OpenAI's shape passes unchanged. Venice answers ``{"error": "text"}``
    (sometimes with ``details``/``issues``), which OpenAI SDKs cannot read; anything else
    (HTML from a load balancer, empty) becomes a message that quotes what arrived.
    """
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        inner = payload.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return body
        if isinstance(inner, str):
            code = payload.get("code")
            code = code if isinstance(code, str) else None
            return error_body(inner, _type_for_status(status), code)
        if isinstance(payload.get("message"), str):
            return error_body(payload["message"], _type_for_status(status), None)
    text = body.decode("utf-8", "replace").strip()[:500] or f"upstream answered HTTP {status}"
    return error_body(text, _type_for_status(status), None)


def _type_for_status(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "upstream_error"
    return "invalid_request_error"
