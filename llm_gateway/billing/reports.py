"""Usage reports: requests, errors, tokens (of them cache reads, cache writes and
reasoning), cost and latency percentiles, grouped by key, subject, protocol, model,
provider, day, end user or a tag's value (``tag:feature``), over a time range. One query
for both stores (the dialects differ in placeholders, day arithmetic, JSON and how money
is stored), aggregated in the database so a report over millions of rows moves only its
groups.

What a group cost is shown as ``spend_usd``: each request at the gateway's price where one
applied, else at the cost its provider reported (``provider_reported_usd`` is that part),
as its budget was charged (``finishing.spent``), so no request is counted twice;
``cost_source`` says which (price, provider, mixed, none). ``cost_usd`` stays the sum of
the gateway's prices alone and ``provider_cost_usd`` of every figure the providers
reported (to set beside their bills)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

GROUPS = ("key", "subject", "protocol", "model", "provider", "day", "end_user", "tag:KEY")
TAG_GROUP = "tag:"
# A tag's key as caller_text admits it: what a tag group names goes into the SQL as it is.
_TAG_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MONEY_UNITS = Decimal(10) ** 10  # SQLite keeps money as integer counts of 1e-10 USD
# The token columns a report sums, in its order.
TOKEN_SUMS = ("prompt_tokens", "completion_tokens", "total_tokens", "cache_read_tokens",
              "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens")
MONEY_SUMS = ("cost_usd", "provider_cost_usd")
# A report row's totals, in its order.
METRICS = ("requests", "errors", *TOKEN_SUMS, *MONEY_SUMS, "spend_usd", "provider_reported_usd",
           "cost_source", "latency_p50_ms", "latency_p95_ms")
# What the query sums, in its order: a request's cost is the gateway's price, else the
# provider's figure (the same rule as finishing.spent), counted as one or the other.
_SUMMED = ("requests", "errors", *TOKEN_SUMS, *MONEY_SUMS, "provider_reported_usd",
           "priced", "provider_priced", "latency_p50_ms", "latency_p95_ms")
_PROVIDER_ONLY = "CASE WHEN cost_usd IS NULL THEN provider_cost_usd END"
COST_LEGEND = ("spend_usd: the gateway's price where one applies, else the cost the provider "
               "reported (cost_source provider, or mixed: provider_reported_usd of it)")


# A spreadsheet runs a cell that starts with one of these as a formula (=HYPERLINK(...),
# +cmd|...): report text is caller-chosen (a model's name is what the request said).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


class ReportError(ValueError):
    """A report that cannot be asked for; str() says why."""


def is_group(name: str) -> bool:
    """Whether a report can be grouped by ``name`` (one of GROUPS, a tag as tag:KEY)."""
    if name.startswith(TAG_GROUP):
        return _TAG_KEY.fullmatch(name[len(TAG_GROUP):]) is not None
    return name in GROUPS and name != "tag:KEY"


def _group_columns(by: Sequence[str], dialect: str) -> list[tuple[str, str]]:
    """(output name, SQL expression) per grouping field."""
    day = ("date(started_at, 'unixepoch')" if dialect == "sqlite"
           else "to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')")
    expressions = {
        "key": [("key_id", "key_id"), ("key_prefix", "key_prefix")],
        "subject": [("subject", "subject_id")], "protocol": [("protocol", "protocol")],
        "model": [("model", "model")],
        "provider": [("provider", "provider")], "day": [("day", day)],
        "end_user": [("end_user", "end_user")],
    }
    columns: list[tuple[str, str]] = []
    for field in by:
        if field.startswith(TAG_GROUP) and _TAG_KEY.fullmatch(key := field[len(TAG_GROUP):]):
            # A record without the tag is in the group of NULL (no value).
            columns.append((field, f"json_extract(tags, '$.\"{key}\"')" if dialect == "sqlite"
                            else f"tags ->> '{key}'"))
            continue
        if field not in expressions:
            raise ReportError(f"cannot group by {field!r}; by one of {', '.join(GROUPS)}")
        columns += expressions[field]
    return columns


def report_sql(by: Sequence[str], dialect: str, since: float | None,
               until: float | None, *, latency: bool = True) -> tuple[str, list[Any]]:
    """The report's query; ``latency=False`` leaves the percentiles out (NULL), and with
    them the sort per group that costs most of a report over many rows."""
    columns = _group_columns(by, dialect) or [("everything", "'all'")]
    mark = "?" if dialect == "sqlite" else "%s"
    where, params = [], []
    for bound, operator in ((since, ">="), (until, "<")):
        if bound is not None:
            where.append(f"started_at {operator} {mark}")
            params.append(bound if dialect == "sqlite" else datetime.fromtimestamp(bound, UTC))
    # Quoted: a tag's group is named as it was asked for (tag:feature).
    names = ", ".join(f'"{name}"' for name, _ in columns)
    selected = ", ".join(f'{expression} AS "{name}"' for name, expression in columns)
    sums = ", ".join((
        "count(*)", "sum(CASE WHEN status >= 400 OR error_code IS NOT NULL THEN 1 ELSE 0 END)",
        *(f"sum({column})" for column in (*TOKEN_SUMS, *MONEY_SUMS)),
        f"sum({_PROVIDER_ONLY})", "count(cost_usd)", f"count({_PROVIDER_ONLY})"))
    where_sql = f"WHERE {' AND '.join(where)}" if where else ""
    if not latency:
        sql = f"""
            SELECT {selected}, {sums}, NULL, NULL
            FROM usage_records {where_sql} GROUP BY {names} ORDER BY {names}
        """
    elif dialect == "postgres":
        # Nearest-rank percentiles as ordered-set aggregates: one sort per group.
        sql = f"""
            SELECT {selected}, {sums},
                   percentile_disc(0.5) WITHIN GROUP (ORDER BY duration_ms),
                   percentile_disc(0.95) WITHIN GROUP (ORDER BY duration_ms)
            FROM usage_records {where_sql} GROUP BY {names} ORDER BY {names}
        """
    else:
        # SQLite has no percentile aggregate. The nearest-rank p-th percentile is the
        # smallest duration whose cumulative share of its group is at least p: one window
        # (cume_dist counts ties as reached together), where ranking and counting by row
        # took two and a 30-day report ran ~1.4x longer.
        sql = f"""
            SELECT {names}, {sums},
                   min(CASE WHEN reached >= 0.5 THEN duration_ms END),
                   min(CASE WHEN reached >= 0.95 THEN duration_ms END)
            FROM (
                SELECT base.*, cume_dist() OVER (PARTITION BY {names} ORDER BY duration_ms)
                               AS reached
                FROM (SELECT {selected}, duration_ms, status, error_code,
                             {", ".join((*TOKEN_SUMS, *MONEY_SUMS))}
                      FROM usage_records {where_sql}) AS base
            ) AS ranked GROUP BY {names} ORDER BY {names}
        """
    if any(name == "key_id" for name, _ in columns):
        # Each key's name, joined by the database (a report of a thousand keys read every
        # key record into Python for their names before). Postgres keeps key ids as UUID
        # and usage key ids as text (a JWT caller's is no UUID): compared as text, hashed.
        key_id = "gateway_keys.id::text" if dialect == "postgres" else "gateway_keys.id"
        sql = f"""SELECT report.*, gateway_keys.name
                  FROM ({sql}) AS report
                  LEFT JOIN gateway_keys ON {key_id} = report.key_id
                  ORDER BY {", ".join(f'report."{name}"' for name, _ in columns)}"""
    return sql, params


async def usage_report(store: Any, by: Sequence[str], since: float | None = None,
                       until: float | None = None, *,
                       latency: bool = True) -> list[dict[str, Any]]:
    """Rows with the grouping fields (for key: key_id, key_prefix, key_name, subject) and
    requests, errors, the sums of TOKEN_SUMS, cost_usd, provider_cost_usd, spend_usd and
    provider_reported_usd (decimal strings), cost_source, p50/p95 latency in ms."""
    by = ["key", "subject", *[f for f in by if f not in ("key", "subject")]] \
        if "key" in by else list(by)
    dialect = getattr(store, "dialect", "sqlite")
    columns = _group_columns(by, dialect) or [("everything", "'all'")]
    sql, params = report_sql(by, dialect, since, until, latency=latency)
    rows = await store.usage_rows(sql, params)
    names = [name for name, _ in columns]
    report = []
    for row in rows:
        group = dict(zip(names, row[: len(names)], strict=True))
        group.pop("everything", None)
        values = dict(zip(_SUMMED, row[len(names):], strict=False))
        entry: dict[str, Any] = {**group}
        if "key" in by:
            entry["key_name"] = row[len(names) + len(_SUMMED)] or ""
        for name in ("requests", "errors", *TOKEN_SUMS):
            entry[name] = int(values[name] or 0)
        entry.update(shown_cost(*(_money(values[name], dialect) for name in (
            *MONEY_SUMS, "provider_reported_usd")), int(values["priced"] or 0),
            int(values["provider_priced"] or 0)))
        for name in ("latency_p50_ms", "latency_p95_ms"):
            entry[name] = _ms(values[name])
        report.append(entry)
    return report


def shown_cost(cost_usd: str, provider_cost_usd: str, provider_reported_usd: str,
               priced: int, provider_priced: int) -> dict[str, str]:
    """A group's money as a report shows it: the sums, what it cost as shown
    (``spend_usd``: the priced requests at their price, the others at the provider's
    figure) and where that came from (``cost_source``)."""
    spend = Decimal(cost_usd) + Decimal(provider_reported_usd)
    source = ("mixed" if priced and provider_priced else "price" if priced
              else "provider" if provider_priced else "none")
    return {"cost_usd": cost_usd, "provider_cost_usd": provider_cost_usd,
            "spend_usd": format(spend.normalize(), "f") if spend else "0",
            "provider_reported_usd": provider_reported_usd, "cost_source": source}


def _money(value: Any, dialect: str) -> str:
    if value is None:
        return "0"
    amount = Decimal(value) / MONEY_UNITS if dialect == "sqlite" else Decimal(value)
    return format(amount.quantize(Decimal("0.0000000001")).normalize(), "f")


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def render(report: list[dict[str, Any]], output: str,
           empty: Sequence[str] = METRICS) -> str:
    """The report as json, csv or a table (of the columns ``empty`` when it has no row)."""
    if output == "json":
        return json.dumps(report, indent=2)
    columns = list(report[0]) if report else [*empty]
    if output == "csv":
        buffer = io.StringIO()
        # RFC 4180's CRLF: the csv module quotes a cell holding a character of its line
        # terminator, so a CR in a name cannot end the row early (and start a formula).
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows({name: csv_cell(value) for name, value in row.items()}
                         for row in report)
        return buffer.getvalue()
    widths = {c: max(len(c), *(len(_cell(row.get(c))) for row in report)) if report else len(c)
              for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    lines += ["  ".join(_cell(row.get(c)).ljust(widths[c]) for c in columns) for row in report]
    if any(row.get("cost_source") in ("provider", "mixed") for row in report):
        lines += ["", COST_LEGEND]
    return "\n".join(lines)


def csv_cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet runs: text that starts as a formula gets a
    leading ``'`` (OWASP's advice for CSV injection), shown by the spreadsheet as the text
    it was. A number, and text that is a plain number (money is written as text, and a
    negative amount must stay a number), stays as it is."""
    if value is None or isinstance(value, int | float):
        return value
    text = str(value)
    if text.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def _cell(value: Any) -> str:
    return "" if value is None else str(value)
