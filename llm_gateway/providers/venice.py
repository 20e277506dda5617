"""Venice AI: OpenAI-compatible, with its own error shape and a cost in every usage.

- Errors are ``{"error": "<text>"}`` (validation failures add ``issues`` or
  ``details``), which OpenAI SDKs cannot read: wrapped into OpenAI's shape, the message
  verbatim.
- Usage carries the request's cost, ``{"usd": .., "diem": ..}``, inside ``usage`` or
  beside it depending on the endpoint; streams always end with a usage chunk.
"""

from __future__ import annotations

from llm_gateway.errors import error_body
from llm_gateway.providers.base import Usage
from llm_gateway.providers.openai import (
    OpenAIProfile,
    error_type_for_status,
    finite_number,
    json_object,
)


class VeniceProfile(OpenAIProfile):
    name = "venice"

    def usage(self, payload: object) -> Usage | None:
        usage = super().usage(payload)
        if usage is None:
            return None
        assert isinstance(payload, dict)
        inner = _as_dict(_as_dict(payload.get("usage")).get("cost"))
        beside = _as_dict(payload.get("cost"))
        usage.cost_usd = finite_number(inner.get("usd"), beside.get("usd"))
        usage.cost_diem = finite_number(inner.get("diem"), beside.get("diem"))
        return usage

    def error_in(self, payload: dict) -> dict[str, str | None] | None:
        error = payload.get("error")
        if isinstance(error, str):
            return {"message": error, "type": None, "code": None}
        return super().error_in(payload)

    def error_body(self, body: bytes, status: int) -> bytes:
        payload = json_object(body)
        if payload is not None and isinstance(payload.get("error"), str):
            code = payload.get("code")
            return error_body(payload["error"], error_type_for_status(status),
                              code if isinstance(code, str) else None)
        return super().error_body(body, status)


def _as_dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}
