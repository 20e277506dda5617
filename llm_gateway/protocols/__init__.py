"""The client protocols the gateway speaks, one module each, and which one a path is.

A path under the API root is a known protocol's (``chat``, ``embeddings``, ``models``), or
any other endpoint an operator allows (``allowed_endpoints``), answered as an
OpenAI-compatible one (``OTHER``). The engine asks the protocol for everything that
differs between them (``base.OpenAICompatible`` says what that is).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_gateway.protocols.base import OpenAICompatible
from llm_gateway.protocols.chat import CHAT, Chat
from llm_gateway.protocols.embeddings import EMBEDDINGS, Embeddings
from llm_gateway.protocols.models import MODELS, Models

OTHER = OpenAICompatible()
PROTOCOL_AT: dict[str, OpenAICompatible] = {
    "/chat/completions": CHAT,
    "/embeddings": EMBEDDINGS,
    "/models": MODELS,
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint the gateway serves, and whose protocol it is."""

    method: str
    path: str
    protocol: OpenAICompatible


def protocol_at(path: str) -> OpenAICompatible:
    """The protocol of ``path`` (relative to the API root)."""
    return PROTOCOL_AT.get(path, OTHER)


__all__ = ["CHAT", "EMBEDDINGS", "MODELS", "OTHER", "Chat", "Embeddings", "Endpoint", "Models",
           "OpenAICompatible", "protocol_at"]
