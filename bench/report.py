"""The run's outputs: the table on stdout (and in Markdown for the docs) and the JSON file."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


def _verdict(goal: Mapping[str, Any]) -> str:
    if goal["met"] is None:
        return f"not judged: {goal['note']}" if goal.get("note") else "not measured"
    verdict = "met" if goal["met"] else f"MISSED by {_num(goal['missed_by'])} {goal['unit']}"
    if goal.get("first_limit") is not None:
        verdict += (f" (the benchmark issue's {goal['comparison']} {_num(goal['first_limit'])}: "
                    f"{'met' if goal['met_first'] else 'missed'})")
    return verdict


def format_goals(goals: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for goal in goals:
        measured = goal["measured"]
        limit = f"{goal['comparison']} {_num(goal['limit'])} {goal['unit']}"
        lines.append(f"  {goal['goal']:<58} {_num(measured):>10}  (goal {limit}): "
                     f"{_verdict(goal)}")
    lines.append(f"  {first_targets_summary(goals)}")
    return "\n".join(lines)


def first_targets_summary(goals: Sequence[Mapping[str, Any]]) -> str:
    """The benchmark issue's own targets (as first set, before issue 15 tightened four of
    them), in one line: what the issues written before issue 15 ask to hold."""
    verdicts = [goal["met_first"] if goal.get("first_limit") is not None else goal["met"]
                for goal in goals if goal.get("source") == "benchmark issue"
                or goal.get("first_limit") is not None]
    judged = [verdict for verdict in verdicts if verdict is not None]
    return (f"the benchmark issue's first targets: {sum(judged)} of {len(judged)} judged met "
            f"({len(verdicts) - len(judged)} not measured or not judged in this run)")


def markdown_goals(goals: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| goal | measured | target | verdict | from |", "|---|---|---|---|---|"]
    for goal in goals:
        limit = f"{goal['comparison']} {_num(goal['limit'])} {goal['unit']}"
        lines.append(f"| {goal['goal']} | {_num(goal['measured'])} | {limit} | "
                     f"{_verdict(goal)} | {goal.get('source', '')} |")
    lines.append(f"\n{first_targets_summary(goals).capitalize()}.")
    return "\n".join(lines)


# ---- the phases and the routed targets, as sections of their own -------------------------------


@dataclass
class Section:
    title: str
    headers: Sequence[str] = ()
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _status_note(figures: Mapping[str, Any]) -> str | None:
    if figures.get("status", "ok") == "ok":
        return None
    return f"{figures.get('status')}: {str(figures.get('reason', ''))[:300]}"


def _routing_section(targets: Mapping[str, Figures]) -> Section | None:
    rows = []
    for name, figures in targets.items():
        routing = figures.get("routing")
        if not routing:
            continue
        observed = ", ".join(f"{where} {share:.1f}%"
                             for where, share in routing["observed_percent"].items())
        configured = "/".join(f"{share:g}" for share in routing["configured_percent"].values())
        rows.append([name, routing["model"], configured, str(routing["requests"]), observed])
    if not rows:
        return None
    return Section("Routing on the measured path (x-llm-gateway-upstream of each answer)",
                   ("target", "alias", "configured %", "requests", "observed"), rows)


def _budget_section(targets: Mapping[str, Figures]) -> Section | None:
    budget = targets.get("serve-budget")
    if not budget:
        return None
    if (note := _status_note(budget)) is not None:
        return Section("serve-budget (Redis limits and budget ledger, prices, a key budget)",
                       notes=[note])
    plain = (targets.get("serve") or {}).get("latency_c1", {}).get("added_ms", {})
    ours = budget.get("latency_c1", {}).get("added_ms", {})
    rows = []
    for p in ("p50", "p90", "p99"):
        a, b = ours.get(p), plain.get(p)
        rows.append([p, _num(b, 3), _num(a, 3),
                     _num(a - b, 3) if a is not None and b is not None else "-"])
    return Section("serve-budget against serve, added latency at c=1 (same run)",
                   ("percentile", "serve +ms", "serve-budget +ms", "difference ms"), rows,
                   [f"serve-budget: {'; '.join(budget.get('notes') or [])}"])


def _budget_phase_section(phase: Mapping[str, Any]) -> Section:
    title = "Budget phase: serve-budget against serve, request by request at c=1"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    legs = ("serve", "serve-redis", "serve-budget", "serve-budget-unleased")
    rows = []
    for p in ("p50", "p90", "p99"):
        row = [p, *(_num((phase.get(name) or {}).get("latency_ms", {}).get(p), 3)
                    for name in legs)]
        for difference in ("redis_limiter_ms", "budget_over_redis_ms", "added_ms",
                           "unleased_ms"):
            row.append(_num((phase.get(difference) or {}).get(p), 3))
        rows.append(row)
    cpu = [_num((phase.get(name) or {}).get("cpu_per_request_us"), 0) for name in legs]
    return Section(title, ("percentile", "serve ms", "serve-redis ms", "serve-budget ms",
                           "no leases ms", "Redis limit +ms", "budget +ms", "difference ms",
                           "no leases +ms"), rows,
                   [f"{phase.get('pairs')} rounds of one request to each, the order "
                    f"alternating; CPU per request at c=1: serve {cpu[0]} us, serve-redis "
                    f"{cpu[1]} us, serve-budget {cpu[2]} us, without leases {cpu[3]} us. "
                    "serve-redis has its rate limit in Redis and no budget: 'Redis limit' is "
                    "what the shared rate limit costs, 'budget' what the budget adds to it. "
                    "The issue 11 goal reads the difference, serve-budget over serve; 'no "
                    "leases' is serve-budget with LIMIT_LEASE_SECONDS=0, every request asking "
                    "Redis."])


def _observability_section(phase: Mapping[str, Any]) -> Section:
    title = "Observability: CPU per request it adds (ACCESS_LOG json vs off, c=8)"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    rows = [[str(i + 1), _num(r["json"], 0), _num(r["off"], 0),
             _num(r["json"] - r["off"], 0) if r["json"] and r["off"] else "-"]
            for i, r in enumerate(phase.get("rounds") or [])]
    rows.append(["median", _num(phase.get("json_us"), 0), _num(phase.get("off_us"), 0),
                 _num(phase.get("access_log_added_us"), 0)])
    notes = [f"Metrics are {phase.get('metrics')}."]
    if phase.get("metrics_us_per_request") is not None:
        notes.append(
            f"Micro-benchmark (this process): metrics {phase['metrics_us_per_request']} us and "
            f"the access-log line {phase['access_log_us_per_request_microbenchmark']} us per "
            f"request. Access log (measured) + metrics (micro-benchmark): "
            f"{_num(phase.get('observability_added_us'), 0)} us per request.")
    elif phase.get("microbenchmark_error"):
        notes.append(f"Metrics micro-benchmark unavailable: {phase['microbenchmark_error']}")
    return Section(title, ("round", "json us/req", "off us/req", "difference us"), rows, notes)


def _inprocess_section(phase: Mapping[str, Any]) -> Section:
    title = "In-process transport: the openai SDK at c=1 (access log off in both gateways)"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    rows = []
    for name, leg in (phase.get("legs") or {}).items():
        rows.append([name, _triple(leg.get("ms"), 3),
                     _triple(leg.get("added_ms"), 3) if leg.get("added_ms") else "(floor)",
                     _num(leg.get("cpu_here_us"), 0), _num(leg.get("cpu_serve_us"), 0),
                     _num(leg.get("added_cpu_us"), 0)])
    notes = [f"{phase.get('requests_per_leg')} requests per leg in interleaved rounds, alias "
             f"{phase.get('model')}; CPU here = the SDK (and the engine, in process) in the "
             "harness's child; added CPU = here minus the direct leg, plus serve's own."]
    return Section(title, ("leg", "p50/p90/p99 ms", "added p50/p90/p99 ms", "CPU us here",
                           "CPU us serve", "added CPU us"), rows, notes)


def _workers_section(phase: Mapping[str, Any]) -> Section:
    title = "serve --workers 2 against one worker (every process on every CPU)"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    one = (phase.get("one_worker") or {}).get("ladder") or []
    two = (phase.get("two_workers") or {}).get("ladder") or []
    rows = [[str(a["concurrency"]), _num(a["throughput_rps"], 0), str(a["errors"]),
             _cores(a), _num(b["throughput_rps"], 0), str(b["errors"]), _cores(b)]
            for a, b in zip(one, two, strict=False)]
    rows.append(["best 0-err", _num(phase["one_worker"].get("max_throughput_rps"), 0), "", "",
                 _num(phase["two_workers"].get("max_throughput_rps"), 0),
                 f"ratio {_num(phase.get('ratio'))}", ""])
    return Section(title, ("c", "1 worker req/s", "errors", "cores: gateway/fake",
                           "2 workers req/s", "errors", "cores: gateway/fake"), rows,
                   [f"{phase.get('cpus')} CPUs; processes: {phase.get('processes')}; the load "
                    "generator and the fake upstream run on the same CPUs; requests per "
                    "gateway core, two workers over one at their best steps: "
                    f"{_num(phase.get('per_core_ratio'))}"])


def _cores(step: Mapping[str, Any]) -> str:
    return f"{_num(step.get('gateway_cores'))}/{_num(step.get('upstream_cores'))}"


def _streams_section(phase: Mapping[str, Any]) -> Section:
    title = "Long-lived streams"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    title = (f"Long-lived streams: up to {phase['streams']} at once, one chunk every "
             f"{phase['delay_ms']} ms for {phase['seconds']:g} s")
    rows = []
    notes = []
    for name, figures in (phase.get("targets") or {}).items():
        if (note := _status_note(figures)) is not None:
            rows.append([name, note[:60]])
            notes.append(f"{name}: {note}")
            continue
        for step in figures.get("steps") or ():
            gaps = step.get("gaps") or {}
            added = step.get("added_gap_ms") or {}
            shares = "/".join(_num(step.get(f"{who}_cpu_share"))
                              for who in ("target", "client", "upstream"))
            rows.append([
                name, str(step["streams"]), str(step.get("streaming_in_window", "-")),
                _num(step.get("rss_mib"), 1), _num(step.get("rss_kib_per_stream"), 1),
                f"{_num(gaps.get('p50_ms'))}/{_num(gaps.get('p99_ms'))}",
                "(floor)" if name == "direct"
                else f"{_num(added.get('p50'))}/{_num(added.get('p99'))}",
                shares,
            ])
        errors = f"{figures['errors']} of {figures['streams']} streams failed"
        if figures["errors"]:
            errors += f": {figures.get('problems')}"
        notes.append(f"{name}: {errors}")
    notes.append("Streaming: streams that had received content and not ended, in the "
                 "window. RSS KiB/stream = (RSS of the target's process tree, median over the "
                 "window, minus its RSS before the first stream) / streaming. Gaps: between "
                 "consecutive content chunks as the client receives them. CPU shares: cores "
                 "used by the target / the harness's client / the paced upstream over the window.")
    return Section(title, ("target", "opened", "streaming", "RSS MiB", "KiB/stream",
                           "gap p50/p99 ms", "added p50/p99 ms", "CPU target/client/upstream"),
                   rows, notes)


def _protocols_section(phase: Mapping[str, Any]) -> Section:
    title = "Protocols: CPU per relayed event through serve, chat, Messages and Responses"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    title = (f"Protocols: CPU per relayed event through serve, {phase['streams']} streams of "
             f"each at once, one event every {phase['delay_ms']} ms for {phase['seconds']:g} s")
    rows = []
    for name, leg in (phase.get("legs") or {}).items():
        ratio, spread = leg.get("steady_ratio_to_chat"), leg.get("steady_ratio_range")
        rows.append([
            name, _num(leg.get("steady_us_per_event")),
            "1" if ratio is None else _num(ratio, 3)
            + (f" ({_num(spread[0], 3)}-{_num(spread[1], 3)})" if spread else ""),
            _num(leg.get("whole_us_per_event")),
            _num(leg.get("whole_ratio_to_chat"), 3) if ratio is not None else "1",
            _num(leg.get("per_stream_us"), 0), _num(leg.get("frames_per_stream"), 0),
            str(leg.get("errors", "-")),
        ])
    return Section(title, ("leg", "steady us/event", "x chat", "whole us/event", "x chat",
                           "us/stream", "events/stream", "errors"), rows,
                   [f"{phase.get('rounds_run')} rounds, every leg at once, each through its own "
                    "serve on the target CPU; the upstream: "
                    f"{phase.get('upstream')}. An event: a content event (a chat chunk, a "
                    "content_block_delta, a response.output_text.delta). Steady: the serve's "
                    "CPU over a window of content events only, per event received; whole: from "
                    "the first connection to the last end, framing events, admission and the "
                    "record included; us/stream: whole minus steady, per stream. x chat: the "
                    "median of the rounds' ratios (their range); chat-again is chat through a "
                    "second serve, the ratio's own noise. Chat's steady figure varied by "
                    f"{_num(phase.get('chat_spread'), 3)} (max-min over median) over the rounds."])


def _translation_section(phase: Mapping[str, Any]) -> Section:
    title = "Translation: CPU per event of a translated stream against the same untranslated"
    if (note := _status_note(phase)) is not None:
        return Section(title, notes=[note])
    title = (f"Translation: CPU per relayed event through serve, {phase['streams']} streams "
             f"of each leg at once, one event every {phase['delay_ms']} ms for "
             f"{phase['seconds']:g} s")
    rows = []
    models = phase.get("models") or {}
    for name, leg in (phase.get("legs") or {}).items():
        ratio, spread = leg.get("steady_ratio_to_untranslated"), leg.get("steady_ratio_range")
        rows.append([
            name, str(models.get(name, "-")), _num(leg.get("steady_us_per_event")),
            "-" if ratio is None else _num(ratio, 3)
            + (f" ({_num(spread[0], 3)}-{_num(spread[1], 3)})" if spread else ""),
            _num(leg.get("whole_us_per_event")),
            _num(leg.get("whole_ratio_to_untranslated"), 3) if ratio is not None else "-",
            _num(leg.get("per_stream_us"), 0), _num(leg.get("frames_per_stream"), 0),
            str(leg.get("errors", "-")),
        ])
    return Section(title, ("leg", "alias", "steady us/event", "x untranslated",
                           "whole us/event", "x untranslated", "us/stream", "events/stream",
                           "errors"), rows,
                   [f"{phase.get('rounds_run')} rounds, every leg at once, each through its own "
                    "serve on the target CPU. A leg a->b: a caller of protocol a on an alias "
                    "whose only target speaks b (claude: Messages; gpt-chat: a chat-only "
                    "provider), its request and stream translated; x untranslated: over the "
                    "same caller's leg untranslated (a), the median of the rounds' ratios "
                    "(their range). Steady, whole and events as in the protocols phase."])


def sections(document: Mapping[str, Any]) -> list[Section]:
    targets = document["targets"]
    phases = document.get("phases") or {}
    found = [_routing_section(targets), _budget_section(targets)]
    builders = {"observability": _observability_section, "inprocess": _inprocess_section,
                "workers": _workers_section, "streams": _streams_section,
                "protocols": _protocols_section, "translation": _translation_section,
                "budget": _budget_phase_section}
    for name, build in builders.items():
        if name in phases:
            found.append(build(phases[name]))
    return [section for section in found if section is not None]


def _text_section(section: Section) -> str:
    lines = [section.title + ":"]
    if section.headers:
        full = [row for row in section.rows if len(row) == len(section.headers)]
        widths = [max([len(section.headers[i]), *(len(row[i]) for row in full)])
                  for i in range(len(section.headers))]
        lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(section.headers, widths,
                                                                 strict=True)))
        for row in section.rows:
            if len(row) != len(widths):
                lines.append("  " + "  ".join(row))
            else:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths,
                                                                          strict=True)))
    lines += [f"  {note}" for note in section.notes]
    return "\n".join(lines)


def _markdown_section(section: Section) -> str:
    lines = [f"**{section.title}**", ""]
    if section.headers:
        lines.append("| " + " | ".join(section.headers) + " |")
        lines.append("|" + "---|" * len(section.headers))
        for row in section.rows:
            cells = list(row) + [""] * (len(section.headers) - len(row))
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        lines.append("")
    lines += [f"{note}" + "  " for note in section.notes]
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
    ]
    for section in sections(document):
        parts += ["", _text_section(section)]
    parts += [
        "",
        "Goals (from the issues):",
        format_goals(document["goals"]),
    ]
    return "\n".join(parts)


def render_markdown(document: Mapping[str, Any]) -> str:
    meta = document["run"]
    parts = [
        f"Measured {meta['date']} ({meta['plan']} run) on {machine_summary(document['machine'])}.",
        "",
        markdown_table(table_rows(document["targets"])),
        "",
    ]
    for section in sections(document):
        parts += [_markdown_section(section), ""]
    parts += [markdown_goals(document.get("goals") or []), ""]
    return "\n".join(parts)


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=False, allow_nan=False) + "\n")
