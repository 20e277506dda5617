"""The usage record: exactly one per admitted request, whatever happened to it.

It says who (key, subject), what (the client protocol, the model as the caller named it,
the provider and the upstream model that answered, stream or not), how it went (status,
error code and the start of its message, timings, attempts) and what it cost (tokens,
whether they were estimated, USD from the gateway's price table, and the provider's own
figure beside it), and whom it was for: the caller's ``tags`` (``x-llm-gateway-tags``,
and a Responses request's ``metadata``) and the ``end_user`` its body names. Never prompt
or completion text. Money is Decimal; times are Unix
seconds.

Tokens compare across providers: ``prompt_tokens`` counts every input token, those read
from the provider's prompt cache (``cache_read_tokens``) and written to it
(``cache_write_tokens``, of which ``cache_write_1h_tokens`` with a one-hour lifetime)
included; ``completion_tokens`` counts every output token, ``reasoning_tokens`` included.
The providers' readers (llm_gateway.providers) normalise their reports to this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

# The start of an error message kept on the record: enough to tell errors apart.
ERROR_MESSAGE_CHARS = 200
# The usage table's columns, in the order every store writes a record's row: its fields,
# with ended_at (started_at + duration) beside started_at for queries by time.
USAGE_COLUMNS = (
    "request_id", "started_at", "ended_at", "key_id", "key_prefix", "subject_id", "adapter",
    "endpoint", "protocol", "model", "provider", "upstream_model", "stream", "status",
    "error_code", "error_message", "prompt_tokens", "completion_tokens", "total_tokens",
    "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens",
    "tokens_estimated", "cost_usd", "provider_cost_usd", "provider_cost_diem", "duration_ms",
    "ttfb_ms", "first_chunk_ms", "max_gap_ms", "attempts", "response_id", "finish_reasons",
    "trace_id", "tags", "end_user",
)
# The spool's fields under the names an earlier version wrote them with: a spool written
# before an upgrade is replayed after it.
_FORMER_NAMES = {"cached_tokens": "cache_read_tokens"}


@dataclass(slots=True)
class UsageRecord:
    request_id: str  # the x-request-id the client got
    key_id: str | None  # None for a caller without a gateway key (a JWT subject)
    subject_id: str
    adapter: str
    endpoint: str
    model: str | None  # as the caller named it (an alias, or a provider's model)
    stream: bool
    status: int
    started_at: float
    duration_ms: float
    key_prefix: str = ""
    # The client protocol: chat, embeddings, messages, responses, models or other.
    protocol: str = ""
    provider: str = ""  # the provider that answered (or was tried last)
    upstream_model: str | None = None  # the model that answered, as the provider names it
    error_code: str | None = None
    error_message: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cache_read_tokens: int = 0  # prompt tokens read from the provider's prompt cache
    cache_write_tokens: int = 0  # prompt tokens written to it (any lifetime)
    cache_write_1h_tokens: int = 0  # the part of cache_write_tokens kept for an hour
    reasoning_tokens: int = 0  # the part of completion_tokens spent reasoning
    tokens_estimated: bool = False  # the provider reported nothing: the gateway counted
    cost_usd: Decimal | None = None  # priced by the gateway's table; None: no price known
    provider_cost_usd: Decimal | None = None  # what the provider says it cost (Venice)
    provider_cost_diem: Decimal | None = None
    response_id: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    ttfb_ms: float | None = None  # upstream response headers
    first_chunk_ms: float | None = None  # first SSE data event
    max_gap_ms: float | None = None  # longest pause between SSE events
    attempts: int = 1
    trace_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # admitted by caller_text
    end_user: str | None = None  # ``user`` (chat, Responses), ``metadata.user_id`` (Messages)

    @property
    def ended_at(self) -> float:
        return self.started_at + self.duration_ms / 1000

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (money as strings, exactly), for the spool."""
        data = dataclasses.asdict(self)
        for name in ("cost_usd", "provider_cost_usd", "provider_cost_diem"):
            if data[name] is not None:
                data[name] = str(data[name])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {_FORMER_NAMES.get(name, name): value for name, value in data.items()
                  if _FORMER_NAMES.get(name, name) in known}
        for name in ("cost_usd", "provider_cost_usd", "provider_cost_diem"):
            if values.get(name) is not None:
                values[name] = Decimal(values[name])
        return cls(**values)


def decimal_or_none(value: float | None) -> Decimal | None:
    """A provider's float cost as the Decimal its text says (0.1, not 0.1000000000000000055)."""
    return None if value is None else Decimal(repr(value))
