"""One request's records, found by its id: ``llm-gateway usage show`` and the admin API's
``GET /admin/v1/usage/{request_id}``.

An id is the ``x-request-id`` the client got or the ``x-trace-id`` of its trace; both are
indexed. A request id names one record; a trace id may name several (a client that sent
several requests in one trace, or retried), oldest first. Each is shown the same way for
the CLI and the API: who, the target that answered (or was tried last) after how many
attempts, timings, tokens, cost and error.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.billing.records import UsageRecord

# The longest id looked up: the gateway makes both ids (req_..., 32 hex digits), far
# shorter; anything longer names no request.
ID_CHARS = 256


async def find_requests(store: Any, request_or_trace_id: str) -> list[dict[str, Any]]:
    """The records an id names, each as ``request_view`` shows it ([] when none)."""
    if not request_or_trace_id or len(request_or_trace_id) > ID_CHARS:
        return []
    return [request_view(record) for record in await store.usage_of(request_or_trace_id)]


def request_view(record: UsageRecord) -> dict[str, Any]:
    """A record grouped as a reader looks for it; money as exact decimal strings."""
    return {
        "request_id": record.request_id,
        "trace_id": record.trace_id,
        "started_at": record.started_at,
        "key_id": record.key_id,
        "key_prefix": record.key_prefix,
        "subject_id": record.subject_id,
        "end_user": record.end_user,
        "tags": dict(record.tags),
        "adapter": record.adapter,
        "protocol": record.protocol,
        "endpoint": record.endpoint,
        "model": record.model,
        "stream": record.stream,
        "target": {"provider": record.provider or None, "upstream_model": record.upstream_model},
        "attempts": record.attempts,
        "status": record.status,
        "error": (None if record.error_code is None
                  else {"code": record.error_code, "message": record.error_message}),
        "timings": {"duration_ms": record.duration_ms, "ttfb_ms": record.ttfb_ms,
                    "first_chunk_ms": record.first_chunk_ms, "max_gap_ms": record.max_gap_ms},
        "tokens": {"prompt": record.prompt_tokens, "completion": record.completion_tokens,
                   "total": record.total_tokens, "cache_read": record.cache_read_tokens,
                   "cache_write": record.cache_write_tokens,
                   "cache_write_1h": record.cache_write_1h_tokens,
                   "reasoning": record.reasoning_tokens, "estimated": record.tokens_estimated},
        "cost": {"cost_usd": _money(record.cost_usd),
                 "provider_cost_usd": _money(record.provider_cost_usd),
                 "provider_cost_diem": _money(record.provider_cost_diem),
                 # Which of the two the request was charged and is shown at.
                 "source": ("price" if record.cost_usd is not None else "provider"
                            if record.provider_cost_usd is not None else "none")},
        "response_id": record.response_id,
        "finish_reasons": list(record.finish_reasons),
    }


def _money(amount: Any) -> str | None:
    return None if amount is None else format(amount.normalize(), "f")


def render_requests(views: list[dict[str, Any]]) -> str:
    """The records as a reader scans them in a terminal: one block per record."""
    blocks = []
    for view in views:
        target, error, timings = view["target"], view["error"], view["timings"]
        tokens, cost = view["tokens"], view["cost"]
        lines = [
            f"request    {view['request_id']}  (trace {view['trace_id'] or '-'})",
            f"caller     key {view['key_prefix'] or '-'}  subject {view['subject_id']}"
            f"  end user {view['end_user'] or '-'}",
            f"tags       {_pairs(view['tags'])}",
            f"asked      {view['protocol'] or view['endpoint']}  model {view['model'] or '-'}"
            f"  {'stream' if view['stream'] else 'whole'}  via {view['adapter']}",
            f"target     {target['provider'] or '-'} / {target['upstream_model'] or '-'}"
            f"  after {view['attempts']} attempt(s)",
            f"status     {view['status']}"
            + (f"  {error['code']}: {error['message'] or ''}" if error else ""),
            f"timings    total {_ms(timings['duration_ms'])}  headers {_ms(timings['ttfb_ms'])}"
            f"  first chunk {_ms(timings['first_chunk_ms'])}"
            f"  longest gap {_ms(timings['max_gap_ms'])}",
            f"tokens     prompt {tokens['prompt']} (cache read {tokens['cache_read']}, write "
            f"{tokens['cache_write']})  completion {tokens['completion']} (reasoning "
            f"{tokens['reasoning']})" + ("  estimated" if tokens["estimated"] else ""),
            f"cost       {cost['cost_usd'] or 'no price'} USD"
            + (f"  provider says {cost['provider_cost_usd']} USD"
               if cost["provider_cost_usd"] is not None else ""),
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _pairs(tags: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in tags.items()) or "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
