"""A reconciliation as JSON (a stable schema: money as decimal strings, ratios as numbers)
or as a table for a person. Model names are the providers' and the records' text: the
table shows them with anything unprintable replaced, so no name can move a terminal's
cursor or colour its output."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from llm_gateway.billing.reconcile import FIGURES, Drift, Line, Reconciliation

SCHEMA_VERSION = 1
_RATIO_PLACES = 6


def _number(value: int | Decimal) -> int | str:
    if isinstance(value, Decimal):
        return format(value.normalize(), "f") if value else "0"
    return value


def _ratio(drift: Drift) -> float | None:
    ratio = drift.relative
    return None if ratio is None else round(float(ratio), _RATIO_PLACES)


def line_json(line: Line) -> dict[str, Any]:
    return {
        "day": line.day, "model": line.model, "within_tolerance": line.within,
        "figures": {drift.figure: {
            "provider": _number(drift.provider), "gateway": _number(drift.gateway),
            "drift": _number(drift.absolute), "drift_ratio": _ratio(drift),
            "within_tolerance": drift.within} for drift in line.drifts},
        "explained_by": {"estimated_tokens": line.estimated, "cost_unknown": line.cost_unknown,
                         "request_ids": list(line.explaining)},
    }


def as_json(result: Reconciliation) -> dict[str, Any]:
    """``lines``: every (day, model) either side has, in day and model order."""
    return {
        "schema_version": SCHEMA_VERSION, "provider": result.provider,
        "since": result.since, "until": result.until,
        "tolerance": format(result.tolerance.normalize(), "f"),
        "within_tolerance": result.within,
        "compared": list(result.compared),
        "not_compared": [name for name in FIGURES if name not in result.compared],
        "lines": [line_json(line) for line in result.lines],
        "drift_ratio_by_model": result.model_drifts(),
    }


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _percent(drift: Drift) -> str:
    ratio = drift.relative
    if ratio is None:
        return "new"
    return f"{float(ratio) * 100:+.2f}%"


def _signed(value: int | Decimal) -> str:
    text = str(_number(value))
    return text if text.startswith("-") or text == "0" else f"+{text}"


def as_table(result: Reconciliation) -> str:
    tolerance = f"{float(result.tolerance) * 100:g}%"
    lines = [f"reconcile {printable(result.provider)}: {result.since} up to {result.until} "
             f"(UTC days), tolerance {tolerance}"]
    header = ("DAY", "MODEL", "FIGURE", "PROVIDER", "GATEWAY", "DRIFT", "DRIFT%", "")
    rows: list[tuple[str, ...]] = []
    for line in result.lines:
        for drift in line.drifts:
            rows.append((line.day, printable(line.model)[:48], drift.figure,
                         str(_number(drift.provider)), str(_number(drift.gateway)),
                         _signed(drift.absolute), _percent(drift),
                         "ok" if drift.within else "BEYOND"))
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                       strict=True)).rstrip())
    for line in result.lines:
        if not line.within and (line.estimated or line.cost_unknown):
            named = ", ".join(printable(r) for r in line.explaining)
            lines.append(f"{line.day} {printable(line.model)}: explained in part by "
                         f"{line.estimated} record(s) with estimated tokens and "
                         f"{line.cost_unknown} with cost unknown" + (f": {named}" if named
                                                                      else ""))
    if not result.lines:
        lines.append("nothing billed and nothing recorded")
    beyond = sum(not line.within for line in result.lines)
    not_compared = [name for name in FIGURES if name not in result.compared]
    if not_compared:
        lines.append(f"not in the provider's report, not compared: {', '.join(not_compared)}")
    lines.append(f"within tolerance {tolerance}" if not beyond else
                 f"BEYOND tolerance {tolerance}: {beyond} of {len(result.lines)} "
                 "day/model line(s)")
    return "\n".join(lines)
