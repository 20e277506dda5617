"""Token usage and cost as reported by OpenAI-compatible providers (OpenAI, Venice, ...)."""

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float | None = None  # Venice reports cost per request
    cost_diem: float | None = None


def usage_from_payload(payload: object) -> Usage | None:
    """The usage of a decoded chat completion, streamed chunk or embeddings response.

    None when the payload carries no usage object. Upstreams disagree on which fields they send,
    so anything missing or malformed counts as 0 (tokens) or unknown (cost) instead of failing:
    metering must never break the relayed response.
    """
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt_tokens = _token_count(usage.get("prompt_tokens"))
    completion_tokens = _token_count(usage.get("completion_tokens"))
    reported_total = usage.get("total_tokens")
    total_tokens = (
        _token_count(reported_total)
        if _is_int(reported_total)
        else prompt_tokens + completion_tokens
    )
    # Venice puts {"diem": .., "usd": ..} inside usage or beside it, depending on the endpoint.
    usage_cost = _as_dict(usage.get("cost"))
    payload_cost = _as_dict(payload.get("cost"))
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=total_tokens,
        cost_usd=_first_number(usage_cost.get("usd"), payload_cost.get("usd")),
        cost_diem=_first_number(usage_cost.get("diem"), payload_cost.get("diem")),
    )


def _is_int(value: object) -> bool:
    # bool is an int subclass, but `true` is never a token count.
    return isinstance(value, int) and not isinstance(value, bool)


def _token_count(value: object) -> int:
    # A negative count would credit the caller; treat it like any other garbage.
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 0


def _as_dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _first_number(*candidates: object) -> float | None:
    for value in candidates:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None
