"""The engine in the application's own process: an httpx transport and openai clients on it.

    from llm_gateway.httpx import GatewayTransport
    client = OpenAI(api_key="unused", base_url="http://llm-gateway/v1",
                    http_client=httpx.Client(transport=GatewayTransport(gateway)))

or, with this process's engine (configured from the environment as ``serve``'s is):
``llm_gateway.openai_client()`` / ``llm_gateway.async_openai_client()``, and for Anthropic's
Messages API ``anthropic_client()`` / ``async_anthropic_client()`` (the anthropic SDK is
built on httpx2: its transport is ``transport_for(httpx2)``). The provider key
stays in the engine: the SDK objects hold the string "unused", and the gateway key, when
one is given, lives in the transport. The adapter is ``llm_gateway.adapters.httpx_transport``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from llm_gateway.adapters.httpx_transport import (
    AsyncGatewayTransport,
    GatewayTransport,
    transport_for,
)
from llm_gateway.adapters.identity import GatewayError, acting_as
from llm_gateway.adapters.inprocess import process_gateway

if TYPE_CHECKING:
    import anthropic
    import openai

__all__ = ["AsyncGatewayTransport", "GatewayError", "GatewayTransport", "acting_as",
           "anthropic_client", "async_anthropic_client", "async_openai_client", "openai_client",
           "transport_for"]

# Never resolved: the transport answers every request itself, whatever the host.
BASE_HOST = "http://llm-gateway"


def _base_url() -> str:
    return BASE_HOST + process_gateway().settings.api_prefix.rstrip("/")


def _anthropic_base_url() -> str:
    """The anthropic SDK adds ``/v1`` to its base URL itself."""
    return _base_url().removesuffix("/v1")


def openai_client(key: str | None = None, **options: Any) -> openai.OpenAI:
    """An ``openai.OpenAI`` whose calls go through this process's engine, charged to the
    identity bound at the time (``acting_as``, ``GatewayMiddleware(govern_outbound=True)``)
    or else to ``key``. ``options`` go to ``openai.OpenAI`` (``max_retries``, ...)."""
    import openai  # the application's dependency, not the gateway's

    transport = GatewayTransport(process_gateway(), key=key)
    return openai.OpenAI(api_key="unused", base_url=_base_url(),
                         http_client=httpx.Client(transport=transport), **options)


def async_openai_client(key: str | None = None, **options: Any) -> openai.AsyncOpenAI:
    """``openai_client``'s ``openai.AsyncOpenAI`` twin."""
    import openai

    transport = GatewayTransport(process_gateway(), key=key)
    return openai.AsyncOpenAI(api_key="unused", base_url=_base_url(),
                              http_client=httpx.AsyncClient(transport=transport), **options)


def anthropic_client(key: str | None = None, **options: Any) -> anthropic.Anthropic:
    """``openai_client``'s twin for Anthropic's Messages API: an ``anthropic.Anthropic``
    whose calls go through this process's engine."""
    import anthropic  # the application's dependency, not the gateway's
    import httpx2

    transport = transport_for(httpx2)(process_gateway(), key=key)
    return anthropic.Anthropic(api_key="unused", base_url=_anthropic_base_url(),
                               http_client=httpx2.Client(transport=transport), **options)


def async_anthropic_client(key: str | None = None, **options: Any) -> anthropic.AsyncAnthropic:
    import anthropic
    import httpx2

    transport = transport_for(httpx2)(process_gateway(), key=key)
    return anthropic.AsyncAnthropic(api_key="unused", base_url=_anthropic_base_url(),
                                    http_client=httpx2.AsyncClient(transport=transport),
                                    **options)
