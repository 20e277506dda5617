"""`llm-gateway usage`: reports over the usage records, and the partitions that hold them."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import time
from typing import Any

from llm_gateway.billing.lookup import find_requests, render_requests
from llm_gateway.billing.refusals import GROUPS as REFUSAL_GROUPS
from llm_gateway.billing.refusals import refusal_report
from llm_gateway.billing.reports import GROUPS, ReportError, render, usage_report
from llm_gateway.cli.common import EXIT_CONFIG, EXIT_FAILED, settings_from, with_store
from llm_gateway.keys import parse_duration
from llm_gateway.stores import Store


def register(commands: Any) -> None:
    usage = commands.add_parser("usage", help="usage reports and partitions").add_subparsers(
        dest="usage_command", required=True)
    report = usage.add_parser("report", help="requests, tokens, cost, errors, latency")
    report.add_argument("--by", default="key",
                        help=f"group by one or more of {', '.join(GROUPS)} (comma-separated; "
                        "tag:feature groups by the value of the tag feature)")
    report.add_argument("--since", help="ISO 8601 date or time (UTC), or a duration ago: 7d")
    report.add_argument("--until", help="ISO 8601 date or time (UTC), or a duration ago")
    report.add_argument("--format", choices=("table", "csv", "json"), default="table",
                        help="how to print the rows")
    report.set_defaults(handler=cmd_usage_report)
    refusals = usage.add_parser(
        "refusals", help="requests refused before admission, by status and code")
    refusals.add_argument("--by", default="",
                          help=f"also by some of {', '.join(REFUSAL_GROUPS)} (comma-separated)")
    refusals.add_argument("--since", help="ISO 8601 date or time (UTC), or a duration ago: 7d")
    refusals.add_argument("--until", help="ISO 8601 date or time (UTC), or a duration ago")
    refusals.add_argument("--format", choices=("table", "csv", "json"), default="table",
                          help="how to print the rows")
    refusals.set_defaults(handler=cmd_usage_refusals)
    show = usage.add_parser(
        "show", help="one request's record(s), by its x-request-id or x-trace-id")
    show.add_argument("request_id", metavar="REQUEST_ID",
                      help="the x-request-id or x-trace-id the client got")
    show.add_argument("--format", choices=("table", "json"), default="table",
                      help="how to print the request")
    show.set_defaults(handler=cmd_usage_show)
    partitions = usage.add_parser(
        "partitions", help="Postgres: create day partitions ahead, drop those past retention")
    partitions.add_argument("--ahead", type=int, default=7, metavar="DAYS",
                            help="create the partitions of this many days ahead")
    partitions.set_defaults(handler=cmd_usage_partitions)


def moment(text: str | None, now: float) -> float | None:
    """A time the report starts or ends at: an ISO date/time (UTC unless it says), or a
    duration ago (``7d``, ``12h``)."""
    if text is None:
        return None
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    parsed = dt.datetime.fromisoformat(text)
    return parsed.replace(tzinfo=parsed.tzinfo or dt.UTC).timestamp()


def cmd_usage_report(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since, until = moment(args.since, now), moment(args.until, now)
        by = [part.strip() for part in args.by.split(",") if part.strip()]
        report = asyncio.run(with_store(
            settings_from(args), lambda store: usage_report(store, by, since, until)))
    except (ValueError, ReportError) as exc:
        print(f"llm-gateway usage report: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(render(report, args.format))
    return 0


def cmd_usage_refusals(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since, until = moment(args.since, now), moment(args.until, now)
        by = [part.strip() for part in args.by.split(",") if part.strip()]
        report = asyncio.run(with_store(
            settings_from(args), lambda store: refusal_report(store, by, since, until)))
    except ValueError as exc:
        print(f"llm-gateway usage refusals: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(render(report, args.format, empty=("status", "code", "requests")))
    return 0


def cmd_usage_show(args: argparse.Namespace) -> int:
    views = asyncio.run(with_store(
        settings_from(args), lambda store: find_requests(store, args.request_id)))
    if not views:
        print(f"llm-gateway usage show: no request has the id {args.request_id!r}",
              file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(views, indent=2) if args.format == "json" else render_requests(views))
    return 0


def cmd_usage_partitions(args: argparse.Namespace) -> int:
    settings = settings_from(args)

    async def work(store: Store) -> dict[str, list[str]]:
        ensure = getattr(store, "ensure_usage_partitions", None)
        if ensure is None:
            return {"created": [], "dropped": []}  # SQLite: one table, nothing to partition
        today = dt.datetime.now(dt.UTC).date()
        created = await ensure(today + dt.timedelta(days=n) for n in range(args.ahead + 1))
        dropped: list[str] = []
        if settings.usage_retention_days:
            dropped = await store.drop_usage_partitions_before(  # type: ignore[attr-defined]
                today - dt.timedelta(days=settings.usage_retention_days))
        return {"created": created, "dropped": dropped}

    print(json.dumps(asyncio.run(with_store(settings, work))))
    return 0
