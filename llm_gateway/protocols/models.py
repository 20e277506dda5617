"""The model list (``GET /models``): the aliases and, when unknown names pass through to the
provider, the provider's own list merged in; either way only what the caller's key may use.
Not metered from an estimate (it has no prompt), and the models it names are not the
upstream model of its record."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from llm_gateway import jsonio
from llm_gateway.protocols.base import OpenAICompatible


class Models(OpenAICompatible):
    name = "models"
    names_upstream_model = False
    estimates_usage = False

    def local_answer(self, aliases: Iterable[str], allows: Callable[[object], bool],
                     passthrough: bool) -> bytes | None:
        """The list the gateway answers itself (only aliases exist), None when the
        provider's is asked for."""
        return None if passthrough else self.listed({"object": "list", "data": []}, aliases,
                                                    allows)

    def client_body(self, body: bytes, aliases: Iterable[str],
                    allows: Callable[[object], bool]) -> bytes | None:
        """The provider's list as the client gets it: with the aliases, filtered."""
        payload = jsonio.object_of(body)
        return body if payload is None else self.listed(payload, aliases, allows)

    @staticmethod
    def listed(payload: dict, aliases: Iterable[str], allows: Callable[[object], bool]) -> bytes:
        names = list(aliases)
        own = [{"id": name, "object": "model", "owned_by": "llm-gateway"} for name in names]
        listed = payload.get("data") if isinstance(payload.get("data"), list) else []
        known = set(names)
        merged = own + [m for m in listed if isinstance(m, dict) and m.get("id") not in known]
        payload["data"] = [m for m in merged if allows(m.get("id"))]
        payload.setdefault("object", "list")
        return json.dumps(payload).encode()


MODELS = Models()
