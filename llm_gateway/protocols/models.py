"""The model list (``GET /models``) and one model (``GET /models/{id}``): the aliases and,
when unknown names pass through to the provider, the provider's own models merged in;
either way only what the caller's key may use (a model it may not use is not there: 404).
In OpenAI's shape, or in Anthropic's when the caller sends ``anthropic-version`` (an
Anthropic SDK's ``models.list``: ``data[].type: "model"``, ``display_name``, ``has_more``,
``first_id``, ``last_id``), errors too. Not metered from an estimate (it has no prompt),
and the models it names are not the upstream model of its record."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from llm_gateway import errors, jsonio
from llm_gateway.errors import ErrorShape, Rejection
from llm_gateway.http_types import IncomingRequest
from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.protocols.messages import anthropic_error

LIST_PATH = "/models"


class Models(OpenAICompatible):
    name = "models"
    names_upstream_model = False
    estimates_usage = False

    def error_shape_for(self, request: IncomingRequest) -> ErrorShape:
        return anthropic_error if _anthropic(request) else self.error_shape

    def local_answer(self, request: IncomingRequest, aliases: Iterable[str],
                     allows: Callable[[object], bool], passthrough: bool,
                     ) -> bytes | Rejection | None:
        """What the gateway answers itself (an alias; the list when only aliases exist),
        a refusal (a model the key may not use), or None: the provider is asked."""
        path = request.path.rstrip("/")
        names = list(aliases)
        if path == LIST_PATH:
            return None if passthrough else _listed(request, {"data": []}, names, allows)
        model = path.rsplit("/", 1)[-1]
        if not allows(model) or (model not in names and not passthrough):
            return errors.model_not_found(model)
        if model not in names:
            return None
        return json.dumps(_shaped(request, _alias(model))).encode()

    def client_body(self, request: IncomingRequest, body: bytes, aliases: Iterable[str],
                    allows: Callable[[object], bool]) -> bytes | None:
        """The provider's answer as the client gets it: a list with the aliases, filtered;
        one model in the caller's shape."""
        payload = jsonio.object_of(body)
        if payload is None:
            return body
        if request.path.rstrip("/") == LIST_PATH:
            return _listed(request, payload, list(aliases), allows)
        return json.dumps(_shaped(request, payload)).encode()


MODELS = Models()


def _anthropic(request: IncomingRequest) -> bool:
    return request.header("anthropic-version") is not None


def _alias(name: str) -> dict:
    return {"id": name, "object": "model", "owned_by": "llm-gateway"}


def _listed(request: IncomingRequest, payload: dict, aliases: list[str],
            allows: Callable[[object], bool]) -> bytes:
    listed = payload.get("data") if isinstance(payload.get("data"), list) else []
    known = set(aliases)
    merged = [_alias(name) for name in aliases] + [
        m for m in listed if isinstance(m, dict) and m.get("id") not in known]
    kept = [m for m in merged if allows(m.get("id"))]
    if not _anthropic(request):
        payload["data"] = kept
        payload.setdefault("object", "list")
        return json.dumps(payload).encode()
    models = [_shaped(request, m) for m in kept]
    return json.dumps({"data": models, "has_more": False,
                       "first_id": models[0]["id"] if models else None,
                       "last_id": models[-1]["id"] if models else None}).encode()


def _shaped(request: IncomingRequest, model: dict) -> dict:
    """One model in the caller's shape (an Anthropic one already is kept as it came)."""
    if not _anthropic(request) or model.get("type") == "model":
        return model
    created = model.get("created")
    when = datetime.fromtimestamp(created if isinstance(created, int) else 0, UTC)
    return {"type": "model", "id": model.get("id"), "display_name": model.get("id"),
            "created_at": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
