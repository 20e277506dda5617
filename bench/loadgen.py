"""Load generators behind one interface: wrk, hey, and the harness's own Python client.

- wrk (C, epoll) drives every plain-HTTP target: it costs least per request, so it is the
  least likely to be the bottleneck. A generated Lua script sets the POST body and headers,
  optionally stops after a number of answers, and prints its figures as one JSON line.
- hey (Go) drives the regular-mode sidecar, which is HTTPS through a CONNECT proxy; wrk
  cannot use a proxy. hey reports latencies with a 0.1 ms resolution.
- The Python client (bench/client.py) is the fallback when neither tool is installed (CI
  installs nothing by hand) and the tool for streams.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bench.client import Endpoint, RequestSpec, closed_loop
from bench.stats import LatencySummary, summarize_latencies

# hey's -n run still ends by this many seconds.
COUNT_LIMITED_CAP_SECONDS = 120
REQUEST_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class Budget:
    """How long one measurement runs: a number of answers, or seconds (whichever is set)."""

    requests: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.seconds is None):
            raise ValueError("a Budget is either requests or seconds")


@dataclass
class LoadResult:
    generator: str
    concurrency: int
    requests: int  # answers received plus transport failures
    errors: int  # non-2xx answers and transport failures
    duration_s: float
    latency: LatencySummary
    error_samples: list[str] = field(default_factory=list)

    @property
    def throughput_rps(self) -> float:
        """Successful requests per second."""
        if self.duration_s <= 0:
            return 0.0
        return (self.requests - self.errors) / self.duration_s

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


class LoadGenerator(Protocol):
    name: str

    def run(
        self, endpoint: Endpoint, spec: RequestSpec, concurrency: int, budget: Budget
    ) -> LoadResult: ...


# ---- wrk ------------------------------------------------------------------------------------

_WRK_SCRIPT = """
wrk.method = {method}
wrk.path = {path}
wrk.body = {body}
{headers}

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH-WRK {{\\"requests\\":%d,\\"duration_us\\":%d,\\"connect\\":%d,\\"read\\":%d," ..
    "\\"write\\":%d,\\"status\\":%d,\\"timeout\\":%d,\\"p50\\":%d,\\"p90\\":%d," ..
    "\\"p99\\":%d,\\"max\\":%d,\\"mean\\":%f}}\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""


def _lua_string(text: str) -> str:
    # A long bracket whose level does not occur in the text needs no escaping at all.
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[{text}]{'=' * level}]"


class WrkGenerator:
    name = "wrk"

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self._scripts = Path(tempfile.mkdtemp(prefix="bench-wrk-"))

    @staticmethod
    def available() -> bool:
        return shutil.which("wrk") is not None

    def _script(self, spec: RequestSpec) -> Path:
        headers = "\n".join(
            f"wrk.headers[ {_lua_string(name)} ] = {_lua_string(value)}"
            for name, value in spec.headers
        )
        text = _WRK_SCRIPT.format(
            method=_lua_string(spec.method), path=_lua_string(spec.path),
            body=_lua_string(spec.body.decode()), headers=headers,
        )
        path = self._scripts / f"request-{hashlib.sha256(text.encode()).hexdigest()[:16]}.lua"
        if not path.exists():
            path.write_text(text)
        return path

    def run(
        self, endpoint: Endpoint, spec: RequestSpec, concurrency: int, budget: Budget
    ) -> LoadResult:
        if endpoint.tls or endpoint.proxy is not None:
            raise ValueError("wrk drives plain-HTTP targets only")
        if budget.seconds is None:
            # wrk's main thread sleeps for -d whatever its threads do: it cannot stop early.
            raise ValueError("wrk runs for a duration only")
        threads = max(1, min(self.threads, concurrency))
        seconds = max(1, round(budget.seconds))  # wrk takes whole seconds
        command = [
            "wrk", f"-t{threads}", f"-c{concurrency}", f"-d{seconds}s",
            f"--timeout={REQUEST_TIMEOUT_SECONDS}s",
            "-s", str(self._script(spec)),
            f"http://{endpoint.authority}{spec.path}",
        ]
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 60, check=False
        )
        match = re.search(r"^BENCH-WRK (\{.*\})$", completed.stdout, re.MULTILINE)
        if match is None:
            raise RuntimeError(
                f"wrk gave no result (exit {completed.returncode}): "
                f"{(completed.stderr or completed.stdout)[-400:]}"
            )
        figures = json.loads(match.group(1))
        socket_errors = sum(figures[k] for k in ("connect", "read", "write", "timeout"))
        # wrk counts an answer with status > 399 both as a request and in errors.status;
        # socket errors other than connect are not in its request count.
        requests = figures["requests"] + figures["connect"]
        errors = figures["status"] + socket_errors
        samples = []
        if errors:
            samples.append(
                f"wrk errors: connect {figures['connect']}, read {figures['read']}, write "
                f"{figures['write']}, timeout {figures['timeout']}, status>399 {figures['status']}"
            )
        to_ms = 1 / 1000
        latency = LatencySummary(
            p50=figures["p50"] * to_ms, p90=figures["p90"] * to_ms, p99=figures["p99"] * to_ms,
            max=figures["max"] * to_ms, mean=figures["mean"] * to_ms,
            count=figures["requests"],
        )
        return LoadResult(self.name, concurrency, requests, errors,
                          figures["duration_us"] / 1e6, latency, samples)


# ---- hey --------------------------------------------------------------------------------------


class HeyGenerator:
    name = "hey"

    @staticmethod
    def available() -> bool:
        return shutil.which("hey") is not None

    def run(
        self, endpoint: Endpoint, spec: RequestSpec, concurrency: int, budget: Budget
    ) -> LoadResult:
        scheme = "https" if endpoint.tls else "http"
        command = ["hey", "-c", str(concurrency), "-m", spec.method,
                   "-t", str(REQUEST_TIMEOUT_SECONDS), "-d", spec.body.decode()]
        if budget.requests is not None:
            # hey splits -n evenly over its workers; it must be a multiple of -c.
            command += ["-n", str(max(concurrency, budget.requests // concurrency * concurrency))]
        else:
            command += ["-z", f"{budget.seconds}s"]
        for name, value in spec.headers:
            if name.lower() == "content-type":
                command += ["-T", value]
            else:
                command += ["-H", f"{name}: {value}"]
        if endpoint.proxy is not None:
            command += ["-x", f"http://{endpoint.proxy[0]}:{endpoint.proxy[1]}"]
        command.append(f"{scheme}://{endpoint.authority}{spec.path}")
        # hey does not verify certificates (InsecureSkipVerify): the sidecar's CA is not needed.
        timeout = (budget.seconds or COUNT_LIMITED_CAP_SECONDS) + 60
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                   check=False, env={**os.environ, "NO_PROXY": ""})
        return parse_hey_output(completed.stdout, concurrency)


def parse_hey_output(text: str, concurrency: int) -> LoadResult:
    def number(pattern: str) -> float:
        found = re.search(pattern, text)
        return float(found.group(1)) if found else math.nan

    total_s = number(r"Total:\s+([\d.]+) secs")
    if math.isnan(total_s):
        raise RuntimeError(f"hey gave no result: {text[-400:]}")
    statuses = {int(code): int(count)
                for code, count in re.findall(r"\[(\d{3})\]\s+(\d+) responses", text)}
    error_section = text.partition("Error distribution:")[2]
    transport_errors = [(int(count), message.strip())
                        for count, message in re.findall(r"\[(\d+)\]\s+(.+)", error_section)]
    answered = sum(statuses.values())
    failed_transport = sum(count for count, _ in transport_errors)
    bad_status = sum(count for code, count in statuses.items() if not 200 <= code < 300)
    percentiles = {int(pct): float(seconds) * 1000
                   for pct, seconds in re.findall(r"(\d+)%+ in ([\d.]+) secs", text)}
    latency = LatencySummary(
        p50=percentiles.get(50, math.nan), p90=percentiles.get(90, math.nan),
        p99=percentiles.get(99, math.nan), max=number(r"Slowest:\s+([\d.]+) secs") * 1000,
        mean=number(r"Average:\s+([\d.]+) secs") * 1000, count=answered,
    )
    samples = [f"{count} x {message[:160]}" for count, message in transport_errors[:3]]
    samples += [f"{count} x HTTP {code}" for code, count in statuses.items()
                if not 200 <= code < 300]
    return LoadResult("hey", concurrency, answered + failed_transport,
                      bad_status + failed_transport, total_s, latency, samples)


# ---- the Python client -----------------------------------------------------------------------


class PythonGenerator:
    name = "python"

    def run(
        self, endpoint: Endpoint, spec: RequestSpec, concurrency: int, budget: Budget
    ) -> LoadResult:
        result = asyncio.run(closed_loop(
            endpoint, spec, concurrency,
            total_requests=budget.requests, duration_s=budget.seconds,
        ))
        return LoadResult(self.name, concurrency, result.requests, result.errors,
                          result.duration_s, summarize_latencies(result.latencies_s),
                          result.error_samples)


def choose_generator(
    endpoint: Endpoint, budget: Budget, *, allow_tools: bool, wrk_threads: int
) -> LoadGenerator:
    """The cheapest generator that can reach ``endpoint`` within ``budget``.

    A budget of a few requests goes to the Python client: wrk cannot stop before its
    duration, and starting a process costs more than such a run.
    """
    if allow_tools and budget.seconds is not None:
        plain = endpoint.proxy is None and not endpoint.tls
        if plain and WrkGenerator.available():
            return WrkGenerator(wrk_threads)
        if HeyGenerator.available():
            return HeyGenerator()
    return PythonGenerator()
