"""The benchmark harness cannot rot: a quick run of the real thing, and its parts.

These tests check structure, never speed: performance is what `python -m bench.run` prints.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from bench.chart import chart_data, write_chart
from bench.client import Endpoint, HttpConnection, check_stream
from bench.goals import check_goals
from bench.loadgen import Budget, PythonGenerator, parse_hey_output
from bench.pngcanvas import Canvas
from bench.report import markdown_table, table_rows
from bench.targets import Target
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from tests.support import BIN, REPO

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _sidecar_works() -> bool:
    completed = subprocess.run([str(BIN / "llm-gateway"), "sidecar", "--help"],
                               capture_output=True, text=True, timeout=60, check=False)
    return completed.returncode == 0


def test_quick_run_prints_the_table_and_writes_json_png_and_markdown(tmp_path):
    targets = ["direct", "serve"] + (["sidecar-reverse"] if _sidecar_works() else [])
    completed = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--targets", ",".join(targets),
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]

    table = completed.stdout
    assert "c=1 p50/p90/p99 ms" in table and "max req/s 0-err" in table
    for name in targets:
        assert any(line.startswith(name) for line in table.splitlines()), table
    assert "Goals (from the issue):" in table

    document = json.loads((tmp_path / "latest.json").read_text())
    assert set(document) == {"run", "machine", "targets", "goals"}
    assert document["run"]["plan"] == "quick"
    assert document["machine"]["cpus"] >= 1 and document["machine"]["python"]
    assert list(document["targets"]) == targets

    direct = document["targets"]["direct"]
    assert direct["max_throughput_rps"] > 0
    assert direct["latency_c1"]["target_ms"]["p50"] > 0
    for name in targets[1:]:
        figures = document["targets"][name]
        assert figures["status"] == "ok", figures
        latency = figures["latency_c1"]
        assert set(latency["added_ms"]) == {"p50", "p90", "p99"}
        assert latency["target_ms"]["count"] > 0 and latency["errors"] == 0
        assert [step["concurrency"] for step in figures["ladder"]] == [1, 16]
        assert all(step["errors"] == 0 and step["throughput_rps"] > 0
                   for step in figures["ladder"])
        assert figures["cpu"]["cpu_per_request_us"] > 0
        streaming = figures["streaming"]
        assert streaming["failed"] == 0 and streaming["ttfb_ms"]["p50"] > 0
        assert {"p50", "p90", "p99"} <= set(streaming["added_ttlb_ms"])
        assert figures["held_streams"]["max_held"] == 8
        assert all(figures["rss_mib"][key] > 0
                   for key in ("idle", "after_warmup", "peak_under_load", "after_run"))
    goals = {goal["goal"]: goal for goal in document["goals"]}
    assert goals["serve: added latency c=1 p50"]["measured"] is not None
    # Too few streams in a quick run to say anything about the 128-stream goal.
    assert goals["serve: paced streams held at once"]["met"] is None

    assert (tmp_path / "latest.png").read_bytes().startswith(PNG_SIGNATURE)
    markdown = (tmp_path / "latest.md").read_text()
    assert "| serve |" in markdown
    assert len(list(tmp_path.glob("bench-*.json"))) == 1


@pytest.fixture
def fake_upstream():
    with running_fake_upstream(FakeUpstream(record=False)) as (fake, base_url):
        port = int(base_url.split(":")[2].split("/")[0])
        yield Target("direct", Endpoint("127.0.0.1", port), "/api/v1/chat/completions",
                     f"Bearer {fake.api_key}", None)


def test_python_load_generator_counts_answers_and_errors(fake_upstream):
    """The fallback when wrk is not installed (CI installs nothing by hand)."""
    result = PythonGenerator().run(fake_upstream.endpoint, fake_upstream.chat_request(), 4,
                                   Budget(requests=60))
    assert result.requests == 60 and result.errors == 0
    assert 0 < result.latency.p50 <= result.latency.p99 <= result.latency.max

    bad_key = Target("direct", fake_upstream.endpoint, fake_upstream.api_path, "Bearer nope",
                     None)
    refused = PythonGenerator().run(bad_key.endpoint, bad_key.chat_request(), 2,
                                    Budget(requests=10))
    assert refused.errors == refused.requests == 10
    assert "HTTP 401" in refused.error_samples[0]


def test_stream_check_sees_every_frame_in_order(fake_upstream):
    async def one_stream(chunks: int):
        connection = HttpConnection(fake_upstream.endpoint)
        try:
            return await connection.request(
                fake_upstream.chat_request(stream_shape=(chunks, 1)))
        finally:
            connection.close()

    reply = asyncio.run(one_stream(6))
    check = check_stream(reply, 6)
    assert check.ok, check.problem
    assert check.content_chunks == 6 and 0 < check.ttfb_s <= check.ttlb_s
    assert not check_stream(reply, 7).ok  # one chunk short is a failure


def test_hey_output_is_parsed_with_errors():
    text = """
Summary:
  Total:\t2.0000 secs
  Slowest:\t0.0500 secs
  Fastest:\t0.0010 secs
  Average:\t0.0040 secs
  Requests/sec:\t500.0000

Latency distribution:
  10% in 0.0020 secs
  50% in 0.0030 secs
  90% in 0.0060 secs
  99% in 0.0200 secs

Status code distribution:
  [200]\t990 responses
  [502]\t5 responses

Error distribution:
  [5]\tPost "https://api.venice.ai/api/v1/chat/completions": EOF
"""
    result = parse_hey_output(text, 8)
    assert result.requests == 1000 and result.errors == 10
    assert result.latency.p50 == pytest.approx(3.0) and result.latency.p99 == pytest.approx(20.0)
    assert result.throughput_rps == pytest.approx(495.0)


def _synthetic_document() -> dict:
    def target(p50: float, rps: float) -> dict:
        return {
            "status": "ok",
            "latency_c1": {"target_ms": {"p50": p50, "p90": p50 * 2, "p99": p50 * 3},
                           "added_ms": {"p50": p50 - 0.2, "p90": 1.0, "p99": 2.0}},
            "ladder": [{"concurrency": c, "throughput_rps": rps * c ** 0.5, "errors": 0,
                        "requests": 100, "error_rate": 0.0} for c in (1, 4, 16)],
            "max_throughput_rps": rps * 4, "max_throughput_concurrency": 16,
            "cpu": {"cpu_per_request_us": 400.0},
            "streaming": {"added_ttfb_ms": {"p50": 0.5}, "added_ttlb_ms": {"p50": -0.1}},
            "held_streams": {"max_held": 128, "levels": [{"streams": 128, "failed": 0},
                                                         {"streams": 256, "failed": 3}]},
            "rss_mib": {"idle": 40.0, "after_warmup": 42.0, "peak_under_load": 50.0,
                        "after_run": 45.0},
        }

    direct = target(0.2, 5000.0)
    del direct["cpu"], direct["rss_mib"]
    return {
        "run": {"date": "2026-01-01 00:00 UTC", "plan": "quick"},
        "targets": {"direct": direct, "serve": target(0.9, 900.0),
                    "litellm": {"status": "unavailable", "reason": "pip install failed"}},
    }


def test_chart_is_drawn_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    path = tmp_path / "chart.png"
    assert write_chart(_synthetic_document(), path) == "builtin"
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 2000
    assert list(chart_data(_synthetic_document()).latency) == ["direct", "serve"]


def test_canvas_writes_a_png_of_the_right_size(tmp_path):
    canvas = Canvas(30, 20)
    canvas.rect(0, 0, 9, 9, (255, 0, 0))
    canvas.text(1, 11, "ok 1.5", (0, 0, 0))
    canvas.save_png(tmp_path / "tiny.png")
    data = (tmp_path / "tiny.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert int.from_bytes(data[16:20], "big") == 30 and int.from_bytes(data[20:24], "big") == 20


def test_goals_report_met_missed_and_unmeasured():
    document = _synthetic_document()
    goals = {goal["goal"]: goal for goal in check_goals(document["targets"])}
    assert goals["serve: added latency c=1 p50"]["met"] is True
    assert goals["serve: CPU per request at c=8"]["met"] is True
    assert goals["serve: paced streams held at once"]["measured"] == 128
    assert goals["serve: max zero-error throughput / LiteLLM's"]["met"] is None  # no LiteLLM
    assert goals["serve: RSS growth over the soak"]["met"] is None
    headroom = goals["harness: direct throughput / best gateway's"]
    assert headroom["met"] is True and headroom["measured"] == pytest.approx(5000 / 900, abs=1e-3)

    document["targets"]["serve"]["latency_c1"]["added_ms"]["p99"] = 3.5
    missed = {g["goal"]: g for g in check_goals(document["targets"])}
    assert missed["serve: added latency c=1 p99"]["met"] is False
    assert missed["serve: added latency c=1 p99"]["missed_by"] == pytest.approx(1.5)


def test_table_rows_show_unavailable_targets_with_their_reason():
    rows = table_rows(_synthetic_document()["targets"])
    assert [row[0] for row in rows] == ["direct", "serve", "litellm"]
    assert rows[2][1].startswith("unavailable: pip install failed")
    assert "| litellm | unavailable: pip install failed |" in markdown_table(rows)
