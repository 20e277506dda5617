"""The gateway's side of a reconciliation: its usage records of one provider, summed per UTC
day and upstream model in the database (as the usage reports are), over [since, until).

A record counts as billed by the provider when the provider answered it (status below
400: a cut stream counts, a refusal or an upstream error does not) and it is of an
endpoint the providers' reports cover (generation: chat, Messages, Responses; not the
model list, token counting or embeddings). Its USD is the gateway's price, else the cost
the provider reported in its answer (``finishing.spent``'s rule). Those with estimated
tokens, or with neither a price nor a reported cost (``cost_unknown``), explain a drift:
they are counted, and the first of them named by request id.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from llm_gateway.billing.reconcile import EXPLAINING_IDS, Figures, Recorded
from llm_gateway.billing.reports import MONEY_UNITS

# The endpoints (usage records' ``endpoint``) whose requests a provider's usage report counts.
BILLED_ENDPOINTS = ("chat.completions", "messages", "responses", "responses.compact")
# Explaining records read at most, over the whole range (each line names EXPLAINING_IDS).
_EXPLAINING_ROWS = 2000


def day_sql(dialect: str) -> str:
    """A record's UTC day (YYYY-MM-DD), as the usage reports group by ``day``."""
    return ("date(started_at, 'unixepoch')" if dialect == "sqlite"
            else "to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')")


def _bounds(dialect: str, since: date, until: date) -> list[Any]:
    moments = [datetime.combine(day, time(), tzinfo=UTC) for day in (since, until)]
    return [m.timestamp() for m in moments] if dialect == "sqlite" else moments


def _where(dialect: str) -> str:
    mark = "?" if dialect == "sqlite" else "%s"
    endpoints = ", ".join(f"'{name}'" for name in BILLED_ENDPOINTS)
    return (f"provider = {mark} AND started_at >= {mark} AND started_at < {mark} "
            f"AND upstream_model IS NOT NULL AND status < 400 AND endpoint IN ({endpoints})")


_UNKNOWN = "cost_usd IS NULL AND provider_cost_usd IS NULL"
_ESTIMATED = "CASE WHEN tokens_estimated THEN 1 ELSE 0 END"


def recorded_sql(dialect: str) -> str:
    day = day_sql(dialect)
    return f"""
        SELECT {day} AS day, upstream_model, count(*), sum(prompt_tokens),
               sum(completion_tokens), sum(cache_read_tokens), sum(cache_write_tokens),
               sum(coalesce(cost_usd, provider_cost_usd)), sum({_ESTIMATED}),
               sum(CASE WHEN {_UNKNOWN} THEN 1 ELSE 0 END)
        FROM usage_records WHERE {_where(dialect)}
        GROUP BY {day}, upstream_model ORDER BY 1, 2
    """


def explaining_sql(dialect: str) -> str:
    return f"""
        SELECT {day_sql(dialect)}, upstream_model, request_id FROM usage_records
        WHERE {_where(dialect)} AND (tokens_estimated OR ({_UNKNOWN}))
        ORDER BY started_at LIMIT {_EXPLAINING_ROWS}
    """


async def recorded(store: Any, provider: str, since: date, until: date) -> list[Recorded]:
    """The gateway's aggregates of ``provider`` over [since, until), per day and model."""
    dialect = getattr(store, "dialect", "sqlite")
    params = [provider, *_bounds(dialect, since, until)]
    explaining: dict[tuple[str, str], list[str]] = {}
    for day, model, request_id in await store.usage_rows(explaining_sql(dialect), params):
        named = explaining.setdefault((str(day), str(model)), [])
        if len(named) < EXPLAINING_IDS:
            named.append(str(request_id))
    found = []
    for row in await store.usage_rows(recorded_sql(dialect), params):
        day, model, requests, prompt, completion, read, write, usd, estimated, unknown = row
        found.append(Recorded(
            day=str(day), model=str(model),
            figures=Figures(requests=int(requests), input_tokens=int(prompt or 0),
                            output_tokens=int(completion or 0),
                            cache_read_tokens=int(read or 0),
                            cache_write_tokens=int(write or 0), usd=_usd(usd, dialect)),
            estimated=int(estimated or 0), cost_unknown=int(unknown or 0),
            explaining=tuple(explaining.get((str(day), str(model)), ()))))
    return found


def _usd(value: Any, dialect: str) -> Decimal:
    if value is None:
        return Decimal(0)
    return Decimal(value) / MONEY_UNITS if dialect == "sqlite" else Decimal(value)
