"""The run's outputs: the table on stdout (and in Markdown for the README) and the JSON file."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.machine import machine_summary

Figures = Mapping[str, Any]


def _median_of_targets(results: Mapping[str, Figures], *path: str) -> float | None:
    values = []
    for name, figures in results.items():
        if name == "direct" or figures.get("status") != "ok":
            continue
        value: Any = figures
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int | float):
            values.append(float(value))
    return round(statistics.median(values), 4) if values else None


def direct_figures(results: dict[str, dict[str, Any]]) -> None:
    """Give the direct row the concurrency-1 and streaming figures measured as the other
    leg of every target's rounds: the median over targets (wrk-measured legs preferred)."""
    direct = results.get("direct")
    if direct is None:
        return
    wrk_measured = {name: figures for name, figures in results.items()
                    if (figures.get("latency_c1") or {}).get("generator") == "wrk"}
    source = wrk_measured or results
    direct["latency_c1"] = {
        "target_ms": {p: _median_of_targets(source, "latency_c1", "direct_ms", p)
                      for p in ("p50", "p90", "p99")},
        "note": "median of the direct legs of every target's rounds",
    }
    direct["streaming"] = {
        "ttfb_ms": {p: _median_of_targets(results, "streaming", "direct_ttfb_ms", p)
                    for p in ("p50", "p90", "p99")},
        "ttlb_ms": {p: _median_of_targets(results, "streaming", "direct_ttlb_ms", p)
                    for p in ("p50", "p90", "p99")},
    }


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _triple(figures: Mapping[str, Any] | None, digits: int = 2) -> str:
    if not figures:
        return "-"
    return "/".join(_num(figures.get(p), digits) for p in ("p50", "p90", "p99"))


def _worst_error(figures: Figures) -> str:
    steps = figures.get("ladder") or []
    if not steps:
        return "-"
    worst = max(steps, key=lambda step: step.get("error_rate", 0))
    rate = worst.get("error_rate", 0) * 100
    return "0" if rate == 0 else f"{rate:.1f}% (c={worst['concurrency']})"


def _rss(figures: Figures) -> str:
    rss = figures.get("rss_mib")
    if not rss:
        return "-"
    return "/".join(_num(rss.get(k), 0) for k in ("idle", "after_warmup", "peak_under_load",
                                                  "after_run"))


def _held(held: Mapping[str, Any]) -> str:
    """Most streams held, and how far their pacing stretched at that level (TTLB p50 over
    the nominal duration): every frame in order is the criterion, the stretch is context."""
    if not held:
        return "-"
    max_held = held.get("max_held")
    levels = held.get("levels") or []
    text = str(max_held)
    if levels and max_held == levels[-1]["streams"]:
        text = f">={text}"  # every level tried held: the ceiling is higher
    at_max = next((level for level in levels if level["streams"] == max_held), None)
    if at_max and at_max.get("ttlb_p50_ms") and at_max.get("nominal_ms"):
        text += f" (x{at_max['ttlb_p50_ms'] / at_max['nominal_ms']:.1f})"
    return text


HEADERS = (
    "target", "c=1 p50/p90/p99 ms", "added p50/p90/p99 ms", "max req/s 0-err (c)",
    "worst err", "CPU/req us (c=8)", "stream TTFB +ms p50", "stream TTLB +ms p50",
    "held streams (TTLB stretch)", "RSS MiB idle/warm/peak/end",
)


def table_rows(results: Mapping[str, Figures]) -> list[list[str]]:
    rows = []
    for name, figures in results.items():
        if figures.get("status") != "ok":
            reason = str(figures.get("reason", ""))
            rows.append([name, f"{figures.get('status', '?')}: {reason[:150]}"])
            continue
        latency = figures.get("latency_c1") or {}
        streaming = figures.get("streaming") or {}
        cpu = figures.get("cpu") or {}
        held = figures.get("held_streams") or {}
        best = figures.get("max_throughput_rps")
        best_at = figures.get("max_throughput_concurrency")
        if name == "direct":
            ttfb = _num((streaming.get("ttfb_ms") or {}).get("p50")) + " abs"
            ttlb = _num((streaming.get("ttlb_ms") or {}).get("p50")) + " abs"
        else:
            ttfb = _num((streaming.get("added_ttfb_ms") or {}).get("p50"))
            ttlb = _num((streaming.get("added_ttlb_ms") or {}).get("p50"))
        held_text = _held(held)
        rows.append([
            name,
            _triple(latency.get("target_ms")),
            _triple(latency.get("added_ms")) if name != "direct" else "(floor)",
            f"{_num(best, 0)} ({_num(best_at)})" if best is not None else "-",
            _worst_error(figures),
            _num(cpu.get("cpu_per_request_us"), 0),
            ttfb,
            ttlb,
            held_text,
            _rss(figures),
        ])
    return rows


def format_table(rows: Sequence[Sequence[str]]) -> str:
    full_rows = [row for row in rows if len(row) == len(HEADERS)]
    widths = [max(len(HEADERS[i]), *(len(row[i]) for row in full_rows)) if full_rows
              else len(HEADERS[i]) for i in range(len(HEADERS))]
    lines = ["  ".join(header.ljust(width) for header, width in zip(HEADERS, widths,
                                                                   strict=True))]
    lines.append("  ".join("-" * width for width in widths))
    for row in rows:
        if len(row) != len(HEADERS):
            lines.append(f"{row[0].ljust(widths[0])}  {row[1]}")
            continue
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                       strict=True)))
    return "\n".join(lines)


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = list(row) + [""] * (len(HEADERS) - len(row))
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines)


def format_goals(goals: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for goal in goals:
        measured = goal["measured"]
        limit = f"{goal['comparison']} {_num(goal['limit'])} {goal['unit']}"
        if goal["met"] is None:
            verdict = "not measured"
        elif goal["met"]:
            verdict = "met"
        else:
            verdict = f"MISSED by {_num(goal['missed_by'])} {goal['unit']}"
        lines.append(f"  {goal['goal']:<58} {_num(measured):>10}  (goal {limit}): {verdict}")
    return "\n".join(lines)


def render_text(document: Mapping[str, Any]) -> str:
    meta = document["run"]
    rows = table_rows(document["targets"])
    parts = [
        f"llm-gateway benchmark ({meta['plan']} run, {meta['date']}) on "
        f"{machine_summary(document['machine'])}",
        f"fake upstream: fast = 8-chunk JSON answer, no delay; streams = "
        f"{meta['stream_shape'][0]} chunks x {meta['stream_shape'][1]} ms; held streams = "
        f"{meta['held_shape'][0]} chunks x {meta['held_shape'][1]} ms. Targets pinned to CPUs "
        f"{meta['target_cpus']}, load generator and fake upstream to {meta['load_cpus']}.",
        "",
        format_table(rows),
        "",
        "Goals (from the issue):",
        format_goals(document["goals"]),
    ]
    return "\n".join(parts)


def render_markdown(document: Mapping[str, Any]) -> str:
    meta = document["run"]
    return "\n".join([
        f"Measured {meta['date']} ({meta['plan']} run) on {machine_summary(document['machine'])}.",
        "",
        markdown_table(table_rows(document["targets"])),
        "",
    ])


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=False, allow_nan=False) + "\n")
