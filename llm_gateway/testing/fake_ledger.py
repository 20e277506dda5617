"""What the fake upstream served, as a provider's billing remembers it: one entry per
generation request it answered (its time, model, tokens and cost), read from the answer it
actually sent (the JSON body, or the stream's usage events), so the ledger bills what the
client got: a stream cut before its usage is not billed, as nothing of it was counted.

The fake's reports (``fake_reports``) are made from this ledger, and can be told to bill
wrongly: ``skew`` +N bills N requests never served (copies of the last one served), -N
leaves the last N served out. Venice's ledger charges ``currency`` (USD, or DIEM at the
fake's DIEM rates).

Prices: Venice's answers carry their cost (``usage.cost``). OpenAI's and Anthropic's do not;
their bills price tokens at ``RATES`` (USD per token), which a test sets as the gateway's
prices (``rates_per_mtok``) so that a ledger billed as served reconciles.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from llm_gateway.asgi_types import Message, Send
from llm_gateway.testing.fake_content import (
    DIEM_PER_COMPLETION_TOKEN,
    DIEM_PER_PROMPT_TOKEN,
    USD_PER_COMPLETION_TOKEN,
    USD_PER_PROMPT_TOKEN,
)

_MILLION = Decimal(1_000_000)
_INPUT = Decimal(repr(USD_PER_PROMPT_TOKEN))
_OUTPUT = Decimal(repr(USD_PER_COMPLETION_TOKEN))
# USD per token, by kind, as each imitated provider's bill prices them (Anthropic's
# multipliers: cache reads 0.1x input, 5-minute writes 1.25x, 1-hour writes 2x).
RATES: dict[str, dict[str, Decimal]] = {
    "openai": {"input": _INPUT, "cached_input": _INPUT / 2, "cache_write_5m": _INPUT,
               "cache_write_1h": _INPUT, "output": _OUTPUT},
    "anthropic": {"input": _INPUT, "cached_input": _INPUT / 10,
                  "cache_write_5m": _INPUT * Decimal("1.25"), "cache_write_1h": _INPUT * 2,
                  "output": _OUTPUT},
    "venice": {"input": _INPUT, "cached_input": _INPUT, "cache_write_5m": _INPUT,
               "cache_write_1h": _INPUT, "output": _OUTPUT},
}
DIEM_RATES = {"input": Decimal(repr(DIEM_PER_PROMPT_TOKEN)),
              "output": Decimal(repr(DIEM_PER_COMPLETION_TOKEN))}
# The endpoints (under the API prefix) whose answers are billed, per imitated provider.
BILLED = {"openai": ("/chat/completions", "/responses"), "venice": ("/chat/completions",),
          "anthropic": ("/messages",)}


def rates_per_mtok(mode: str) -> dict[str, Decimal]:
    """RATES of ``mode`` in USD per million tokens: what ``prices set`` takes."""
    return {kind: rate * _MILLION for kind, rate in RATES[mode].items()}


@dataclass(frozen=True, slots=True)
class Served:
    at: float  # Unix seconds, when the answer ended
    model: str
    request_id: str  # the answer's id (Venice's ledger calls it requestId)
    input_tokens: int  # every input token, cache reads and writes included
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reported_usd: Decimal | None = None  # Venice's usage.cost
    reported_diem: Decimal | None = None

    @property
    def uncached_input_tokens(self) -> int:
        return max(self.input_tokens - self.cache_read_tokens - self.cache_write_5m_tokens
                   - self.cache_write_1h_tokens, 0)

    def cost_parts(self, mode: str) -> dict[str, Decimal]:
        """USD by kind: input (uncached), cached_input, cache_write_5m, cache_write_1h,
        output, at ``mode``'s rates."""
        rates = RATES[mode]
        return {"input": self.uncached_input_tokens * rates["input"],
                "cached_input": self.cache_read_tokens * rates["cached_input"],
                "cache_write_5m": self.cache_write_5m_tokens * rates["cache_write_5m"],
                "cache_write_1h": self.cache_write_1h_tokens * rates["cache_write_1h"],
                "output": self.output_tokens * rates["output"]}


class ServedLedger:
    """Every billed request the fake answered, and how its bill is to be skewed."""

    def __init__(self, mode: str, *, skew: int = 0, currency: str = "USD") -> None:
        self.mode = mode
        self.skew = skew
        self.currency = currency
        self.served: list[Served] = []

    def bills(self, method: str, endpoint: str) -> bool:
        return method == "POST" and endpoint in BILLED.get(self.mode, ())

    def watch(self, send: Send) -> ServedWatch:
        return ServedWatch(self, send)

    def billed(self) -> list[Served]:
        """What the bill says was served: the ledger, skewed."""
        served = list(self.served)
        if self.skew < 0:
            return served[:max(len(served) + self.skew, 0)]
        if served and self.skew > 0:
            last = served[-1]
            served += [replace(last, request_id=f"{last.request_id}-unserved-{n}")
                       for n in range(self.skew)]
        return served

    def clear(self) -> None:
        self.served.clear()


class ServedWatch:
    """A copy of one answer as it is sent; ``finish`` books it when it was a success."""

    def __init__(self, ledger: ServedLedger, send: Send) -> None:
        self._ledger = ledger
        self._send = send
        self._status = 0
        self._body = bytearray()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._status = int(message["status"])
        elif message["type"] == "http.response.body":
            self._body.extend(message.get("body", b""))
        await self._send(message)

    def finish(self) -> None:
        if self._status == 200:
            served = served_from(self._ledger.mode, bytes(self._body), time.time())
            if served is not None:
                self._ledger.served.append(served)


def _events(body: bytes) -> Iterator[dict[str, Any]]:
    """The JSON payloads of an answer: the body itself, or each SSE ``data:`` event."""
    stripped = body.lstrip()
    if stripped.startswith(b"{"):
        try:
            found = json.loads(body)
        except ValueError:
            return
        if isinstance(found, dict):
            yield found
        return
    for line in body.splitlines():
        if line.startswith(b"data:"):
            try:
                event = json.loads(line[5:].strip())
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def _count(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def served_from(mode: str, body: bytes, at: float) -> Served | None:
    """The entry an answer of ``mode`` makes, or None when it carries no usage."""
    reader = _anthropic if mode == "anthropic" else _openai
    found: dict[str, Any] = {}
    for event in _events(body):
        reader(event, found)
    if "input_tokens" not in found or "model" not in found:
        return None
    return Served(at=at, model=str(found["model"]), request_id=str(found.get("id", "")),
                  **{name: value for name, value in found.items()
                     if name not in ("model", "id")})


def _openai(event: dict[str, Any], found: dict[str, Any]) -> None:
    """Chat completions (an answer, or chunks ending with a usage chunk) and Responses (an
    answer, or response.completed's)."""
    if isinstance(event.get("response"), dict):  # a Responses stream event
        event = event["response"]
    for name in ("model", "id"):
        if isinstance(event.get(name), str):
            found.setdefault(name, event[name])
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return
    prompt = "prompt_tokens" if "prompt_tokens" in usage else "input_tokens"
    output = "completion_tokens" if prompt == "prompt_tokens" else "output_tokens"
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    found.update(input_tokens=_count(usage, prompt), output_tokens=_count(usage, output),
                 cache_read_tokens=_count(details, "cached_tokens")
                 if isinstance(details, dict) else 0)
    cost = usage.get("cost")
    if isinstance(cost, dict):
        for name, field in (("usd", "reported_usd"), ("diem", "reported_diem")):
            if isinstance(cost.get(name), int | float):
                found[field] = Decimal(repr(cost[name]))


def _anthropic(event: dict[str, Any], found: dict[str, Any]) -> None:
    """A message, or its stream: message_start's usage (input and cache), then
    message_delta's final output count."""
    message = event.get("message") if event.get("type") == "message_start" else event
    if not isinstance(message, dict):
        return
    for name in ("model", "id"):
        if isinstance(message.get(name), str):
            found.setdefault(name, message[name])
    usage = message.get("usage")
    if not isinstance(usage, dict):
        return
    if "cache_creation" in usage or "input_tokens" not in found:
        creation = usage.get("cache_creation") if isinstance(usage.get("cache_creation"),
                                                             dict) else {}
        five, hour = (_count(creation, "ephemeral_5m_input_tokens"),
                      _count(creation, "ephemeral_1h_input_tokens"))
        read = _count(usage, "cache_read_input_tokens")
        found.update(input_tokens=_count(usage, "input_tokens") + read + five + hour,
                     cache_read_tokens=read, cache_write_5m_tokens=five,
                     cache_write_1h_tokens=hour)
    found["output_tokens"] = _count(usage, "output_tokens")
