"""llm-gateway: one policy engine for LLM traffic (OpenAI chat completions, embeddings and
Responses; Anthropic Messages).

The public API. Names are imported on first use, so that importing one part of the
package (the injector, the fake upstream, the CLI's ``--help``) does not load the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from llm_gateway.version import VERSION as __version__

if TYPE_CHECKING:
    from llm_gateway.config import Settings, load_settings
    from llm_gateway.engine import Gateway
    from llm_gateway.http_types import IncomingRequest
    from llm_gateway.wiring import build_gateway

__all__ = [
    "Gateway",
    "GatewayError",
    "IncomingRequest",
    "Settings",
    "__version__",
    "acting_as",
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "build_gateway",
    "load_settings",
    "openai_client",
]

_HOMES = {
    "Gateway": "llm_gateway.engine",
    "IncomingRequest": "llm_gateway.http_types",
    "Settings": "llm_gateway.config",
    "load_settings": "llm_gateway.config",
    "build_gateway": "llm_gateway.wiring",
    "acting_as": "llm_gateway.adapters.identity",
    "GatewayError": "llm_gateway.adapters.identity",
    "openai_client": "llm_gateway.httpx",
    "async_openai_client": "llm_gateway.httpx",
    "anthropic_client": "llm_gateway.httpx",
    "async_anthropic_client": "llm_gateway.httpx",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'llm_gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
