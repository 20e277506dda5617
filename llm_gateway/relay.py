"""The engine's own sending: one admitted request to its upstream, and the answer back.

Every adapter that lets the engine send gets the same behaviour from here: pooled
connections, retries before the first byte, OpenAI-shaped 502/504s, and streams relayed
chunk by chunk while the exchange observes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from llm_gateway.errors import UpstreamFailure
from llm_gateway.exchange import Exchange
from llm_gateway.messages import GatewayResponse
from llm_gateway.routing.client import UpstreamClient, UpstreamResponse

_STREAM_BROKE_OFF = "The upstream provider's stream broke off before it was complete."


class Relay:
    def __init__(self, client: UpstreamClient) -> None:
        self.client = client

    async def respond(self, exchange: Exchange) -> GatewayResponse:
        """Send upstream and produce the client's response (streams stay streams)."""
        try:
            response, exchange.attempts = await self.client.open(
                exchange.upstream, exchange.request.method, exchange.upstream_url(),
                exchange.upstream_headers(), exchange.request.body,
            )
        except UpstreamFailure as failure:
            exchange.attempts = failure.attempts
            return _failure_response(exchange, failure)
        headers = exchange.on_response_start(response.status, response.headers)
        if exchange.is_sse:
            return GatewayResponse(response.status, headers, chunks=_stream(exchange, response))
        try:
            raw = await response.read()
        except UpstreamFailure as failure:
            return _failure_response(exchange, failure)
        return GatewayResponse(response.status, headers, exchange.complete_body(raw))

    async def aclose(self) -> None:
        await self.client.aclose()


def _failure_response(exchange: Exchange, failure: UpstreamFailure) -> GatewayResponse:
    exchange.fail(failure.status, failure.code)
    return GatewayResponse(
        failure.status, [("content-type", "application/json"), *exchange.gateway_headers()],
        failure.body(),
    )


async def _stream(exchange: Exchange, response: UpstreamResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.chunks():
            exchange.on_chunk(chunk)
            yield chunk
    except UpstreamFailure as failure:
        # Headers are gone already: the status cannot change. Tell the client in band,
        # the way providers do, so SDKs raise instead of ending quietly.
        exchange.fail(failure.status, failure.code)
        yield b"data: " + UpstreamFailure(failure.code, _STREAM_BROKE_OFF).body() + b"\n\n"
    finally:
        response.close()
