"""Upstream providers: where a request goes, with which server-held key, and the client
that sends it (pooled connections, timeouts, retries with backoff).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from llm_gateway.config import Secret

# Statuses worth another attempt: the provider said "not now", not "no".
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# A Retry-After longer than this is passed to the client instead of waited out.
MAX_RETRY_WAIT_SECONDS = 20.0


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    base_url: str  # the provider's API root, e.g. https://api.venice.ai/api/v1
    api_key: Secret
    max_retries: int = 2
    timeout: float = 120.0
    connect_timeout: float = 5.0
    backoff_base: float = 0.5
    backoff_max: float = 8.0

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    def url(self, path: str, query: str = "") -> str:
        return f"{self.base_url}{path}" + (f"?{query}" if query else "")

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: spreads retries of many clients apart."""
        ceiling = min(self.backoff_max, self.backoff_base * 2**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


class UpstreamFailure(Exception):
    """The upstream could not be reached or did not answer in time."""

    def __init__(self, status: int, code: str, message: str, attempts: int) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.attempts = attempts


def retry_after_seconds(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Seconds the provider asked us to wait (Retry-After / retry-after-ms), if any."""
    if (millis := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


class UpstreamClient:
    """One shared httpx client: pooled keep-alive connections to every provider."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
            # Providers get 'identity' so the stream parser sees plain SSE.
            headers={"accept-encoding": "identity"},
            follow_redirects=False,
            trust_env=False,
        )

    async def open(
        self,
        upstream: Upstream,
        method: str,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> tuple[httpx.Response, int]:
        """Send and return the open response (headers read, body not) and the attempt count.

        Connection errors and retryable statuses are retried up to ``max_retries`` times
        before any byte of a response reached the caller, so a stream is never retried
        once it started. The caller must ``aclose()`` the response.
        """
        timeout = httpx.Timeout(upstream.timeout, connect=upstream.connect_timeout)
        attempt = 0
        while True:
            request = self._client.build_request(
                method, url, headers=headers, content=body or None, timeout=timeout
            )
            try:
                response = await self._client.send(request, stream=True)
            except httpx.TimeoutException as exc:
                # Only a connect timeout is safe to retry: a read timeout already cost
                # the whole budget once.
                if isinstance(exc, httpx.ConnectTimeout) and attempt < upstream.max_retries:
                    attempt += 1
                    await asyncio.sleep(upstream.backoff(attempt - 1))
                    continue
                raise UpstreamFailure(
                    504, "upstream_timeout",
                    f"The upstream provider '{upstream.name}' did not answer in time.",
                    attempt + 1,
                ) from None
            except httpx.TransportError:
                if attempt < upstream.max_retries:
                    attempt += 1
                    await asyncio.sleep(upstream.backoff(attempt - 1))
                    continue
                raise UpstreamFailure(
                    502, "upstream_unreachable",
                    f"The upstream provider '{upstream.name}' could not be reached.",
                    attempt + 1,
                ) from None
            if response.status_code in RETRYABLE_STATUSES and attempt < upstream.max_retries:
                wait = retry_after_seconds(response.headers)
                if wait is None:
                    wait = upstream.backoff(attempt)
                if wait <= MAX_RETRY_WAIT_SECONDS:
                    await response.aclose()
                    attempt += 1
                    await asyncio.sleep(wait)
                    continue
            return response, attempt + 1

    async def aclose(self) -> None:
        await self._client.aclose()
