"""Streams mitmproxy relays itself: bytes to the client as they arrive, decoded when the
provider compressed them anyway, and to the engine's observer."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable

from mitmproxy import http

from llm_gateway.exchange import Exchange

log = logging.getLogger("llm_gateway.sidecar")


class SseRelay:
    """``flow.response.stream``: every byte goes to the client as it arrives, unchanged
    (decoded if the provider compressed it anyway), and to the engine's SSE observer."""

    __slots__ = ("decoder", "exchange")

    def __init__(self, exchange: Exchange, decoder: IncrementalDecoder | None) -> None:
        self.exchange = exchange
        self.decoder = decoder

    def __call__(self, chunk: bytes) -> bytes:
        data = chunk
        if self.decoder is not None:
            try:
                # mitmproxy calls with b"" once at the end: the decoder's remainder.
                data = self.decoder.feed(chunk) if chunk else self.decoder.flush()
            except Exception:
                log.warning("llm-gateway: undecodable stream from the upstream")
                self.exchange.fail(502, "upstream_broken_response")
                return b""
        if data:
            try:
                self.exchange.on_chunk(data)
            except Exception:
                # Observation is best effort here: the client's bytes must flow regardless.
                log.exception("llm-gateway: SSE observer failed")
        return data


class IncrementalDecoder:
    """Undoes a content-encoding chunk by chunk (the engine asks for identity; not every
    provider listens)."""

    def __init__(self, feed: Callable[[bytes], bytes], flush: Callable[[], bytes]) -> None:
        self.feed = feed
        self.flush = flush

    @classmethod
    def for_encoding(cls, content_encoding: str) -> IncrementalDecoder | None:
        """A decoder, or None for an encoding it cannot undo."""
        if content_encoding in ("gzip", "x-gzip", "deflate"):
            # 32 + MAX_WBITS reads gzip and zlib headers alike.
            inflater = zlib.decompressobj(32 + zlib.MAX_WBITS)
            return cls(inflater.decompress, inflater.flush)
        if content_encoding == "br":
            import brotli

            brotli_decoder = brotli.Decompressor()
            return cls(brotli_decoder.process, lambda: b"")
        return None


def stream_framing(upstream: http.Headers, *, decoded: bool) -> list[tuple[str, str]]:
    """The client's framing for a relayed stream: the upstream's own, unless decoding
    changed the length. mitmproxy reads it from the same headers to decide whether the
    upstream connection can be reused, so it must stay true to what the upstream sent.
    (HTTP/2 clients get frames: mitmproxy drops transfer-encoding for them.)"""
    content_length = upstream.get("content-length")
    if content_length and "transfer-encoding" not in upstream and not decoded:
        return [("content-length", content_length)]
    return [("transfer-encoding", "chunked")]
