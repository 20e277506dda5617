"""The names the OpenTelemetry GenAI semantic conventions give what the gateway does, shared
by the spans (tracing.py) and the OTLP metrics (otel_metrics.py).

- ``gen_ai.operation.name``: a request of chat completions, Anthropic's Messages or OpenAI's
  Responses is ``chat`` (the conventions' inference operation; OpenAI's conventions tell the
  two OpenAI APIs apart with ``openai.api.type``), embeddings ``embeddings``; the gateway's
  other endpoints (the model list, counting tokens, a stored response's retrieval, ...) have
  no well-known value and keep the usage record's ``endpoint`` (a fixed set).
- ``gen_ai.provider.name``: from the provider's *profile*, never the operator's name for the
  provider (``venice-eu``, ``openai-backup``): a well-known value where the conventions have
  one (``anthropic``, ``openai``, ``gcp.gemini``), else the profile's own name (``venice``,
  ``generic``), as the conventions allow a custom value. So the attribute is bounded by the
  profiles the gateway ships. The operator's name is ``llm_gateway.provider``.
  ``gen_ai.system``, which the conventions replaced with ``gen_ai.provider.name``, is not
  emitted.
- ``llm_gateway.protocol``: the client protocol (``protocol_label``), one of ``PROTOCOLS``.
"""

from __future__ import annotations

# The usage record's ``protocol``: the wire protocols and the endpoints of no wire protocol.
PROTOCOLS = frozenset({"chat", "embeddings", "messages", "responses", "models", "other"})

_OPERATIONS = {
    "chat.completions": "chat", "messages": "chat", "responses": "chat",
    "responses.compact": "chat", "embeddings": "embeddings",
}
# Profile name -> the conventions' well-known gen_ai.provider.name.
_PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "gemini": "gcp.gemini"}
# openai.api.type, for the two OpenAI APIs an "openai" provider answers.
_OPENAI_API_TYPES = {"chat": "chat_completions", "responses": "responses"}


def operation_name(endpoint: str) -> str:
    """``gen_ai.operation.name`` of a usage record's ``endpoint``."""
    return _OPERATIONS.get(endpoint, endpoint)


def provider_name(profile: str) -> str:
    """``gen_ai.provider.name`` of a provider profile."""
    return _PROVIDERS.get(profile, profile or "none")


def protocol_label(protocol: str) -> str:
    """A usage record's ``protocol`` as a label: one of ``PROTOCOLS``."""
    return protocol if protocol in PROTOCOLS else "other"


def openai_api_type(provider: str, protocol: str) -> str | None:
    """``openai.api.type``: set only where ``gen_ai.provider.name`` is ``openai``."""
    return _OPENAI_API_TYPES.get(protocol) if provider == "openai" else None
