"""Reading a provider's usage and cost report over HTTP: every page of each of its report
streams (``provider_reports``), with the provider's timeouts, no redirects followed (an
admin key goes to the provider's host only), and errors that name the provider, the path
and the HTTP status, never the admin key. Only ``llm-gateway reconcile`` imports it: no
gateway loads httpx for it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Any

from llm_gateway.billing.provider_reports import Ledger, ReportFormatError, query_text
from llm_gateway.billing.reconcile import Billed

# A report of a year of days is a few dozen pages; more is a provider's cursor gone wrong.
MAX_PAGES = 500
_DETAIL_CHARS = 200
# Key-like words a provider's error text may echo back (masked or not).
_KEYS = re.compile(r"\b(sk|key|admin)[-_][A-Za-z0-9*._-]{4,}")


@dataclass(frozen=True, slots=True)
class ReportSource:
    """Where a provider's reports are: its name, API root, static headers, timeouts."""

    name: str
    base_url: str
    headers: tuple[tuple[str, str], ...] = ()
    connect_timeout: float = 5.0
    read_timeout: float = 60.0

    def url(self, path: str, query: str) -> str:
        return f"{self.base_url}{path}" + (f"?{query}" if query else "")


class ReportFetchError(Exception):
    """The provider's report could not be read: str() says which and why, without the key."""


def _detail(body: bytes, admin_key: str) -> str:
    """The start of an error answer, with anything key-like taken out."""
    text = body[:2000].decode("utf-8", "replace").replace(admin_key, "[admin key]")
    text = _KEYS.sub("[redacted]", " ".join(text.split()))
    return text[:_DETAIL_CHARS]


async def fetch_billed(provider: ReportSource, ledger: Ledger, admin_key: str,
                       since: date, until: date, *, transport: Any = None) -> list[Billed]:
    """Every row of the provider's report over [since, until)."""
    import httpx  # only this command reads a provider's report

    auth = ledger.headers(admin_key)
    taken = {name for name, _ in auth}
    headers = [*((name, value) for name, value in provider.headers if name not in taken),
               *auth]
    timeout = httpx.Timeout(connect=provider.connect_timeout, read=provider.read_timeout,
                            write=provider.read_timeout, pool=provider.connect_timeout)
    rows: list[Billed] = []
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False,
                                 transport=transport) as client:
        for stream in ledger.streams(since, until):
            items: list[Any] = []
            query: Any = stream.query
            for _ in range(MAX_PAGES):
                body = await _get(client, provider, stream.path, query, headers, admin_key)
                try:
                    found, query = ledger.page(stream, body)
                except ReportFormatError as exc:
                    raise ReportFetchError(f"{provider.name}: GET {stream.path}: "
                                           f"not the documented report: {exc}") from None
                items += found
                if query is None:
                    break
            else:
                raise ReportFetchError(f"{provider.name}: GET {stream.path}: more than "
                                       f"{MAX_PAGES} pages")
            try:
                rows += ledger.rows(stream, items)
            except ReportFormatError as exc:
                raise ReportFetchError(f"{provider.name}: GET {stream.path}: not the "
                                       f"documented report: {exc}") from None
    return rows


async def _get(client: Any, provider: ReportSource, path: str, query: Any,
               headers: list[tuple[str, str]], admin_key: str) -> Any:
    import httpx

    where = f"{provider.name}: GET {path}"
    try:
        answer = await client.get(provider.url(path, query_text(query)), headers=headers)
    except httpx.TimeoutException:
        raise ReportFetchError(f"{where}: timed out") from None
    except httpx.HTTPError as exc:
        raise ReportFetchError(f"{where}: failed ({type(exc).__name__})") from None
    if answer.status_code != 200:
        raise ReportFetchError(f"{where}: answered HTTP {answer.status_code}: "
                               f"{_detail(answer.content, admin_key)}")
    try:
        return answer.json()
    except ValueError:
        raise ReportFetchError(f"{where}: answered HTTP 200 with no JSON") from None
