"""The upstream client: one attempt at one provider, with its timeouts, over one shared
pool of keep-alive connections (``routing/http1.py``, where it says why the gateway has its
own). Retries and failover are the relay's.
"""

from __future__ import annotations

import email.utils
import functools
import time
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

from llm_gateway.errors import UpstreamFailure
from llm_gateway.routing.http1 import (
    BadEncoding,
    ConnectionBroken,
    ConnectionPool,
    Decoder,
    Http1Connection,
    Origin,
    UnknownEncoding,
    decoder_for,
    request_head,
)
from llm_gateway.routing.table import ProviderConfig

# What a failure says about the target, for passive health.
CONNECT, TIMEOUT, BROKEN = "connect", "timeout", "broken"


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the provider asked us to wait (Retry-After / retry-after-ms /
    x-ratelimit-reset-*), if any."""
    if (millis := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value).timestamp()
            except (TypeError, ValueError):
                return None
            return max(0.0, when - (time.time() if now is None else now))
    resets = [parse_duration(headers[name]) for name in
              ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens") if name in headers]
    known = [seconds for seconds in resets if seconds is not None]
    return max(known) if known else None


def parse_duration(text: str) -> float | None:
    """OpenAI's reset durations: '1m30s', '12s', '250ms', '6m0.5s'."""
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    index, text = 0, text.strip()
    while index < len(text):
        char = text[index]
        if char.isdigit() or char == ".":
            number += char
            index += 1
            continue
        unit = "ms" if text.startswith("ms", index) else char
        if unit not in units or not number:
            return None
        try:
            total += float(number) * units[unit]
        except ValueError:
            return None
        number, index = "", index + len(unit)
    return total if not number else None


def _failure(provider: str, kind: str, code: str, attempts: int = 1) -> UpstreamFailure:
    messages = {
        "upstream_unreachable": f"The upstream provider '{provider}' could not be reached.",
        "upstream_timeout": f"The upstream provider '{provider}' did not answer in time.",
        "upstream_broken_response": f"The upstream provider '{provider}' broke off its answer.",
        "upstream_stream_interrupted":
            f"The upstream provider '{provider}' broke off its stream.",
        "upstream_response_too_large":
            f"The upstream provider '{provider}' sent more than the gateway accepts.",
    }
    return UpstreamFailure(code, messages[code], attempts, kind=kind)


def stream_cut(provider: str) -> UpstreamFailure:
    """A stream whose body ended before its protocol's end (no ``[DONE]``, no
    ``message_stop``, ...): cut, as a chunked body broken off is, whatever framed it. A body
    without length or chunks ends with its connection, so a cut one ends as a whole one
    does on the wire; only the relay, which reads the protocol, can tell."""
    return _failure(provider, BROKEN, "upstream_stream_interrupted")


class UpstreamResponse:
    """An upstream answer whose headers have arrived; the body is read or streamed once."""

    __slots__ = ("_connection", "_decoder", "_ended", "_pool", "_provider", "_read_timeout",
                 "headers", "status")

    def __init__(self, connection: Http1Connection, pool: ConnectionPool, provider: str,
                 read_timeout: float, decoder: Decoder | None) -> None:
        self._connection = connection
        self._pool = pool
        self._provider = provider
        self._read_timeout = read_timeout
        self._decoder = decoder
        self._ended = False
        self.status = connection.status
        self.headers: list[tuple[str, str]] = connection.headers

    def header_map(self) -> Mapping[str, str]:
        """The headers by lower-case name (the first of a repeated one)."""
        found: dict[str, str] = {}
        for name, value in self.headers:
            found.setdefault(name, value)
        return found

    async def _raw_piece(self, broken_code: str) -> bytes | None:
        try:
            return await self._connection.next_body_piece(self._read_timeout)
        except TimeoutError:
            raise _failure(self._provider, TIMEOUT, "upstream_timeout") from None
        except ConnectionBroken:
            raise _failure(self._provider, BROKEN, broken_code) from None

    async def _piece(self, broken_code: str) -> bytes | None:
        """The next piece of the body as the provider meant it (decoded, at most
        DECODED_PIECE of it when it was compressed); None at its end."""
        decoder = self._decoder
        if decoder is None:
            return await self._raw_piece(broken_code)
        try:
            while not self._ended:
                if out := decoder.more():
                    return out
                raw = await self._raw_piece(broken_code)
                if raw is None:
                    self._ended = True
                    return decoder.end() or None
                if out := decoder.push(raw):
                    return out
        except BadEncoding:
            raise _failure(self._provider, BROKEN, broken_code) from None
        return None

    async def read(self, limit: int) -> bytes:
        """The whole body, decoded; more than ``limit`` bytes (after decompression, so a
        small compressed bomb counts as what it becomes) is a failure, not a buffer."""
        parts: list[bytes] = []
        size = 0
        try:
            while (piece := await self._piece("upstream_broken_response")) is not None:
                size += len(piece)
                if size > limit:
                    raise _failure(self._provider, BROKEN, "upstream_response_too_large")
                parts.append(piece)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            self.close()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, piece by piece; never waits for more than one read."""
        try:
            while (piece := await self._piece("upstream_stream_interrupted")) is not None:
                yield piece
        finally:
            self.close()

    def close(self) -> None:
        """Gives the connection back: to the pool when the answer was read to its end
        (else it is closed: half an answer must not reach the next request)."""
        if self._connection is not None:
            self._pool.release(self._connection)
            self._connection = None  # type: ignore[assignment]


@functools.lru_cache(maxsize=512)
def _split(url: str) -> tuple[Origin, str, str]:
    """(origin, request target, Host header) of an upstream URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    default = 443 if scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (scheme, host, port), target, shown if port == default else f"{shown}:{port}"


class UpstreamClient:
    """One shared pool of connections to every provider, on the loop that uses it."""

    def __init__(self) -> None:
        self._pool = ConnectionPool()

    async def send(
        self, provider: ProviderConfig, method: str, url: str, headers: list[tuple[str, str]],
        body: bytes, *, read_timeout: float,
    ) -> UpstreamResponse:
        """One attempt: the response once its headers arrived (the body is the caller's to
        read, stream or close). Raises UpstreamFailure with ``kind`` connect or timeout."""
        origin, target, host = _split(url)
        head = request_head(method, target, host, headers, body)
        connection = await self._answer_head(provider, origin, head, body)
        status = connection.status
        if 300 <= status < 400:
            # Never followed (the key would go wherever it points) nor relayed (the client
            # would send its prompt there, past the gateway): a provider that redirects is
            # misconfigured, and the next target is tried.
            connection.abort()
            raise UpstreamFailure(
                "upstream_broken_response",
                f"The upstream provider '{provider.name}' answered with a redirect "
                f"({status}), which the gateway does not follow: check its base_url.",
                kind=BROKEN)
        try:
            decoder = decoder_for(next(
                (value for name, value in connection.headers if name == "content-encoding"),
                None))
        except UnknownEncoding as exc:
            connection.abort()
            raise UpstreamFailure(
                "upstream_broken_response",
                f"The upstream provider '{provider.name}' answered in an encoding the "
                f"gateway cannot read ({exc}).", kind=BROKEN) from None
        return UpstreamResponse(connection, self._pool, provider.name, read_timeout, decoder)

    async def _answer_head(self, provider: ProviderConfig, origin: Origin, head: bytes,
                           body: bytes) -> Http1Connection:
        """The request sent, and the connection once the answer's head is in."""
        timeouts = provider.timeouts
        for last_try in (False, True):
            try:
                connection = await self._pool.acquire(origin, timeouts.connect, new=last_try)
            except TimeoutError:
                raise _failure(provider.name, TIMEOUT, "upstream_timeout") from None
            except OSError:  # refused, unreachable, name unknown, TLS refused or untrusted
                raise _failure(provider.name, CONNECT, "upstream_unreachable") from None
            try:
                connection.send(head, body)
                await connection.answer_head(connection.loop.time() + timeouts.first_byte)
                return connection
            except TimeoutError:
                connection.abort()
                raise _failure(provider.name, TIMEOUT, "upstream_timeout") from None
            except ConnectionBroken:
                if last_try or not connection.reused or connection.answered:
                    raise _failure(provider.name, CONNECT, "upstream_unreachable") from None
                # A kept-alive connection the provider closed as the request went out
                # (its idle timeout): nothing was answered, so once more, on a new one.
            except BaseException:
                connection.abort()  # cancelled: the answer, if any, is nobody's
                raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._pool.close()
