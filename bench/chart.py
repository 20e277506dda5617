"""The PNG chart: latency percentiles, throughput per concurrency, streaming and memory.

matplotlib draws it when installed (the optional ``bench`` dependency group); otherwise a
plainer chart with the same four panels is drawn with bench/pngcanvas.py, so a run always
writes its PNG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.pngcanvas import Canvas, Color

PALETTE: dict[str, Color] = {
    "direct": (110, 110, 110),
    "serve": (31, 119, 180),
    "serve-legacy": (120, 170, 220),
    "serve-budget": (23, 190, 207),
    "sidecar-reverse": (44, 160, 44),
    "sidecar-regular": (148, 103, 189),
    "litellm": (214, 39, 40),
}
SERIES_SHADES: tuple[float, ...] = (1.0, 0.7, 0.45, 0.25)


@dataclass
class ChartData:
    title: str
    latency: dict[str, list[float | None]]  # target -> c=1 p50, p90, p99 (ms, absolute)
    ladder: dict[str, list[tuple[int, float]]]  # target -> (concurrency, req/s)
    streaming: dict[str, list[float | None]]  # target -> added TTFB p50, added TTLB p50 (ms)
    rss: dict[str, list[float | None]]  # target -> idle, after warm-up, peak, after run (MiB)


def chart_data(document: Mapping[str, Any]) -> ChartData:
    targets: Mapping[str, Mapping[str, Any]] = document["targets"]
    ok = {name: figures for name, figures in targets.items() if figures.get("status") == "ok"}

    def percentiles(figures: Mapping[str, Any] | None, keys: Sequence[str]) -> list[float | None]:
        figures = figures or {}
        return [figures.get(key) for key in keys]

    meta = document["run"]
    return ChartData(
        title=f"llm-gateway benchmark {meta['date']} ({meta['plan']})",
        latency={name: percentiles((f.get("latency_c1") or {}).get("target_ms"),
                                   ("p50", "p90", "p99")) for name, f in ok.items()},
        ladder={name: [(step["concurrency"], step["throughput_rps"])
                       for step in f.get("ladder") or ()] for name, f in ok.items()},
        streaming={name: [((f.get("streaming") or {}).get("added_ttfb_ms") or {}).get("p50"),
                          ((f.get("streaming") or {}).get("added_ttlb_ms") or {}).get("p50")]
                   for name, f in ok.items() if name != "direct"},
        rss={name: percentiles(f.get("rss_mib"),
                               ("idle", "after_warmup", "peak_under_load", "after_run"))
             for name, f in ok.items() if f.get("rss_mib")},
    )


def write_chart(document: Mapping[str, Any], path: Path) -> str:
    """Write the PNG; returns which renderer drew it."""
    data = chart_data(document)
    try:
        import matplotlib
    except ImportError:
        _draw_with_canvas(data, path)
        return "builtin"
    matplotlib.use("Agg")
    _draw_with_matplotlib(data, path)
    return "matplotlib"


def _hex(color: Color) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


def _shade(color: Color, factor: float) -> Color:
    """``factor`` 1 keeps the colour; smaller mixes it towards white."""
    return tuple(round(255 - (255 - c) * factor) for c in color)  # type: ignore[return-value]


def _draw_with_matplotlib(data: ChartData, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(14, 9))
    figure.suptitle(data.title)

    def grouped_bars(axis: Any, values: dict[str, list[float | None]],
                     series: Sequence[str], ylabel: str, log: bool) -> None:
        names = list(values)
        width = 0.8 / max(1, len(series))
        for index, label in enumerate(series):
            for position, name in enumerate(names):
                value = values[name][index]
                if value is None:
                    continue
                x = position - 0.4 + width * (index + 0.5)
                shown = max(value, 1e-3) if log else value
                axis.bar(x, shown, width, color=_hex(_shade(PALETTE.get(name, (0, 0, 0)),
                                                            SERIES_SHADES[index])),
                         edgecolor="black", linewidth=0.3,
                         label=label if position == 0 else None)
                axis.annotate(f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}",
                              (x, shown), ha="center", va="bottom", fontsize=7)
        axis.set_xticks(range(len(names)), names, fontsize=8)
        axis.set_ylabel(ylabel)
        if log:
            axis.set_yscale("log")
        else:
            axis.axhline(0, color="black", linewidth=0.5)
        axis.legend(fontsize=8)

    grouped_bars(axes[0][0], data.latency, ("p50", "p90", "p99"), "ms (log)", log=True)
    axes[0][0].set_title("Latency at concurrency 1 (absolute; direct = floor)")
    for name, points in data.ladder.items():
        if points:
            xs, ys = zip(*points, strict=True)
            axes[0][1].plot(xs, ys, marker="o", label=name, color=_hex(PALETTE.get(name,
                                                                                   (0, 0, 0))))
    axes[0][1].set_xscale("log", base=2)
    axes[0][1].set_yscale("log")
    axes[0][1].set_xlabel("concurrent connections (closed loop)")
    axes[0][1].set_ylabel("successful requests/s (log)")
    axes[0][1].set_title("Throughput per target (one CPU each)")
    axes[0][1].legend(fontsize=8)
    grouped_bars(axes[1][0], data.streaming, ("added TTFB p50", "added TTLB p50"),
                 "ms over direct", log=False)
    axes[1][0].set_title("Streaming: time added to first and last byte")
    grouped_bars(axes[1][1], data.rss, ("idle", "after warm-up", "peak under load",
                                        "after run"), "MiB", log=False)
    axes[1][1].set_title("Resident memory of the gateway process")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ---- the fallback ---------------------------------------------------------------------------

_INK: Color = (40, 40, 40)
_GRID: Color = (225, 225, 225)


def _nice_ceiling(value: float) -> float:
    if value <= 0 or math.isnan(value):
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


class _Panel:
    """A plotting area inside the canvas with a linear y axis from ``low`` to ``high``."""

    def __init__(self, canvas: Canvas, box: tuple[int, int, int, int], title: str,
                 low: float, high: float) -> None:
        self.canvas = canvas
        self.left, self.top, self.right, self.bottom = box
        self.low, self.high = low, high
        canvas.text(self.left, self.top - 22, title, _INK, 2)
        for tick in range(6):
            value = low + (high - low) * tick / 5
            y = self.y(value)
            canvas.line(self.left, y, self.right, y, _GRID)
            text = _label(value)
            canvas.text(self.left - Canvas.text_width(text) - 4, y - 3, text, _INK)
        canvas.line(self.left, self.top, self.left, self.bottom, _INK)
        canvas.line(self.left, self.y(0) if low < 0 else self.bottom, self.right,
                    self.y(0) if low < 0 else self.bottom, _INK)

    def y(self, value: float) -> int:
        span = (self.high - self.low) or 1.0
        fraction = (value - self.low) / span
        return round(self.bottom - fraction * (self.bottom - self.top))


def _bar_panel(canvas: Canvas, box: tuple[int, int, int, int], title: str,
               values: dict[str, list[float | None]], series: Sequence[str]) -> None:
    present = [v for row in values.values() for v in row if v is not None]
    high = _nice_ceiling(max(present, default=1.0) * 1.1)
    low = -_nice_ceiling(-min(present) * 1.1) if present and min(present) < 0 else 0.0
    panel = _Panel(canvas, box, title, low, high)
    names = list(values)
    if not names:
        return
    group_width = (panel.right - panel.left) / len(names)
    bar_width = max(2, int(group_width * 0.8 / len(series)))
    for position, name in enumerate(names):
        group_left = panel.left + int(group_width * position + group_width * 0.1)
        for index, value in enumerate(values[name]):
            if value is None:
                continue
            x0 = group_left + index * bar_width
            color = _shade(PALETTE.get(name, (0, 0, 0)), SERIES_SHADES[index])
            canvas.rect(x0, panel.y(max(value, 0)), x0 + bar_width - 2,
                        panel.y(min(value, 0)), color)
        label = name[:max(3, int(group_width // 6) - 1)]
        canvas.text(group_left, panel.bottom + 6, label, _INK)
    legend_x = panel.right - 10 - max(Canvas.text_width(s) for s in series) - 14
    for index, label in enumerate(series):
        y = panel.top + 4 + index * 12
        canvas.rect(legend_x, y, legend_x + 8, y + 7, _shade((90, 90, 90), SERIES_SHADES[index]))
        canvas.text(legend_x + 12, y, label, _INK)


def _line_panel(canvas: Canvas, box: tuple[int, int, int, int], title: str,
                lines: dict[str, list[tuple[int, float]]]) -> None:
    levels = sorted({c for points in lines.values() for c, _ in points})
    top = max((rps for points in lines.values() for _, rps in points), default=1.0)
    panel = _Panel(canvas, box, title, 0.0, _nice_ceiling(top * 1.1))
    if not levels:
        return
    span = max(1, len(levels) - 1)

    def x(concurrency: int) -> int:
        return panel.left + 10 + round((panel.right - panel.left - 20)
                                       * levels.index(concurrency) / span)

    for concurrency in levels:
        canvas.text(x(concurrency) - 6, panel.bottom + 6, str(concurrency), _INK)
    for index, (name, points) in enumerate(lines.items()):
        color = PALETTE.get(name, (0, 0, 0))
        previous = None
        for concurrency, rps in points:
            here = (x(concurrency), panel.y(rps))
            canvas.rect(here[0] - 2, here[1] - 2, here[0] + 2, here[1] + 2, color)
            if previous is not None:
                canvas.line(*previous, *here, color, 2)
            previous = here
        canvas.rect(panel.right - 130, panel.top + 4 + index * 12,
                    panel.right - 122, panel.top + 11 + index * 12, color)
        canvas.text(panel.right - 118, panel.top + 4 + index * 12, name, _INK)


def _draw_with_canvas(data: ChartData, path: Path) -> None:
    canvas = Canvas(1400, 900)
    canvas.text(20, 12, data.title, _INK, 2)
    margin_left, gap = 70, 60
    width = (1400 - margin_left * 2 - gap) // 2
    rows = ((70, 420), (500, 850))
    columns = (margin_left, margin_left * 2 + width + gap - margin_left)
    boxes = [(x, top, x + width, bottom) for top, bottom in rows for x in columns]
    _bar_panel(canvas, boxes[0], "latency c=1 ms p50/p90/p99", data.latency,
               ("p50", "p90", "p99"))
    _line_panel(canvas, boxes[1], "throughput req/s by concurrency", data.ladder)
    _bar_panel(canvas, boxes[2], "stream added ms ttfb/ttlb p50", data.streaming,
               ("ttfb", "ttlb"))
    _bar_panel(canvas, boxes[3], "rss mib idle/warm/peak/end", data.rss,
               ("idle", "warm", "peak", "end"))
    canvas.save_png(path)


# ---- the streams chart: added delay and memory against concurrent streams -------------------


@dataclass
class StreamsChartData:
    title: str
    added_p50: dict[str, list[tuple[int, float]]]  # target -> (open streams, added gap p50 ms)
    added_p99: dict[str, list[tuple[int, float]]]
    rss: dict[str, list[tuple[int, float]]]  # target -> (open streams, RSS MiB); 0 = before
    note: str | None = None
    # target -> the steps at which not every stream opened was being served (hollow markers)
    partial: dict[str, set[int]] = field(default_factory=dict)
    # target -> its RSS before the streams plus the goal's KiB per stream, as a line
    goal_lines: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


# Issue 15's memory per open stream, KiB, drawn as a line from each gateway's starting RSS.
STREAM_RSS_GOALS_KIB = {"serve": 40, "sidecar-reverse": 100}


def streams_chart_data(document: Mapping[str, Any]) -> StreamsChartData:
    meta = document["run"]
    phase = (document.get("phases") or {}).get("streams") or {}
    title = f"llm-gateway long-lived streams {meta['date']} ({meta['plan']})"
    data = StreamsChartData(title, {}, {}, {})
    if phase.get("status", "missing") != "ok":
        data.note = f"streams phase: {phase.get('status', 'not run')} {phase.get('reason', '')}"
        return data
    data.title += (f": one chunk every {phase['delay_ms']} ms for {phase['seconds']:g} s, "
                   f"up to {phase['streams']} streams")
    for name, figures in (phase.get("targets") or {}).items():
        if figures.get("status") != "ok":
            continue
        steps = figures.get("steps") or []
        if name == "direct":
            # The floor's own lateness: the p99 gap over the nominal interval.
            data.added_p99["direct (p99 gap - interval)"] = [
                (s["streams"], s["gaps"]["p99_ms"] - phase["delay_ms"]) for s in steps
                if s["gaps"].get("p99_ms") is not None]
            continue
        for series, key in ((data.added_p50, "p50"), (data.added_p99, "p99")):
            series[name] = [(s["streams"], s["added_gap_ms"][key]) for s in steps
                            if (s.get("added_gap_ms") or {}).get(key) is not None]
        points = [(s["streams"], s["rss_mib"]) for s in steps if s.get("rss_mib") is not None]
        before = figures.get("rss_before_mib")
        if before is not None:
            points.insert(0, (0, before))
            if name in STREAM_RSS_GOALS_KIB and steps:
                most = steps[-1]["streams"]
                data.goal_lines[name] = [
                    (0, before), (most, before + most * STREAM_RSS_GOALS_KIB[name] / 1024)]
        data.rss[name] = points
        data.partial[name] = {s["streams"] for s in steps
                              if s.get("streaming_in_window", s["streams"]) < s["streams"]}
    return data


def write_streams_chart(document: Mapping[str, Any], path: Path) -> str:
    """The PNG of the streams phase (a placeholder saying why when it did not run)."""
    data = streams_chart_data(document)
    try:
        import matplotlib
    except ImportError:
        _draw_streams_with_canvas(data, path)
        return "builtin"
    matplotlib.use("Agg")
    _draw_streams_with_matplotlib(data, path)
    return "matplotlib"


def _color(name: str) -> Color:
    return PALETTE.get(name.split(" ")[0], (0, 0, 0))


def _draw_streams_with_matplotlib(data: StreamsChartData, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    figure.suptitle(data.title, fontsize=11)
    delay, memory = axes

    def hollow(axis: Any, name: str, points: list[tuple[int, float]], style: str,
               label: str | None) -> None:
        xs, ys = zip(*points, strict=True)
        color = _hex(_color(name))
        axis.plot(xs, ys, style, marker="o", color=color, label=label)
        partial = [(x, y) for x, y in points if x in data.partial.get(name, ())]
        if partial:  # not every stream was being served there
            px, py = zip(*partial, strict=True)
            axis.plot(px, py, "o", markersize=9, markerfacecolor="white", color=color)

    for name, points in data.added_p99.items():
        if points:
            direct = name.startswith("direct")
            hollow(delay, name, points, ":" if direct else "-",
                   name if direct else f"{name} p99")
    for name, points in data.added_p50.items():
        if points:
            hollow(delay, name, points, "--", f"{name} p50")
    delay.set_xlabel("concurrent streams (hollow: not every stream was being served)")
    delay.set_ylabel("added inter-chunk delay over direct, ms (symlog)")
    delay.set_yscale("symlog", linthresh=1.0)
    delay.set_title("Added inter-chunk delay")
    delay.axhline(0, color="black", linewidth=0.5)
    for name, points in data.rss.items():
        if points:
            hollow(memory, name, points, "-", name)
    for name, points in data.goal_lines.items():
        xs, ys = zip(*points, strict=True)
        memory.plot(xs, ys, ":", color=_hex(_color(name)),
                    label=f"{name} goal ({STREAM_RSS_GOALS_KIB[name]} KiB/stream)")
    memory.set_xlabel("concurrent streams (hollow: not every stream was being served)")
    memory.set_ylabel("RSS of the gateway's process tree, MiB")
    memory.set_title("Memory")
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    if data.note:
        figure.text(0.5, 0.5, data.note, ha="center", va="center")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _draw_streams_with_canvas(data: StreamsChartData, path: Path) -> None:
    canvas = Canvas(1400, 520)
    canvas.text(20, 12, data.title[:150], _INK, 2)
    if data.note:
        canvas.text(70, 60, data.note[:120], _INK, 2)
    width = (1400 - 70 * 2 - 60) // 2
    _line_panel(canvas, (70, 80, 70 + width, 470), "added inter-chunk p99 ms",
                {name: [(x, max(0.0, y)) for x, y in points]
                 for name, points in data.added_p99.items()})
    _line_panel(canvas, (70 * 2 + width + 60 - 70, 80, 1400 - 70, 470), "rss mib", data.rss)
    canvas.save_png(path)
