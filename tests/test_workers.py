"""`serve --workers N`: one listening socket, N processes, and on the embedded default
(SQLite, no Redis) limits, budgets and health that stay exact across them because the
workers share a SQLite file beside the database. Also the supervisor's life cycle (a dead
worker replaced, SIGHUP replacing every worker, SIGTERM stopping them all cleanly with one
usage record per admitted request), SIGHUP in a single process, and the WORKERS setting.

Every gateway here runs on the embedded default whatever the suite runs on
(TEST_DATABASE_URL, TEST_REDIS_URL): that default is what the workers' file is for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import yaml

from llm_gateway.billing.ledger import Draw, Hold, MemoryLedger
from llm_gateway.billing.ledger_sqlite import SqliteLedger
from llm_gateway.billing.model import BudgetScope
from llm_gateway.cli import build_parser
from llm_gateway.cli.run import serve_settings
from llm_gateway.config import ConfigError, load_settings, usable_cpus
from llm_gateway.limits import Guard, MemoryRateLimiter
from llm_gateway.limits.sqlite import SqliteRateLimiter, WorkersFile
from llm_gateway.routing.health import CLEAN, HealthBook, Outcome, State
from llm_gateway.routing.shared_health import SharedHealth, SqliteEvidence
from llm_gateway.routing.table import HealthPolicy
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.wiring import build_gateway
from tests.billing_support import set_budget
from tests.support import (
    BIN,
    create_key,
    free_port,
    roomy_window,
    stop_process,
    usage_records,
    wait_until_up,
)

CHAT = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "Hello"}]}


@dataclass
class Served:
    """A `llm-gateway serve` process, its output, and the requests it answered 200 (by key
    id): each must end as exactly one usage record."""

    url: str
    process: subprocess.Popen[str]
    output: Path
    database_url: str
    admitted: collections.Counter[str] = field(default_factory=collections.Counter)
    keys: dict[str, str] = field(default_factory=dict)  # by name, for later tests

    def log(self) -> str:
        return self.output.read_text()

    def wait_for_log(self, pattern: str, timeout: float = 30) -> list[str]:
        """Every match of ``pattern`` once there is one."""
        deadline = time.monotonic() + timeout
        while not (found := re.findall(pattern, self.log())):
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.log()}"
            time.sleep(0.05)
        return found

    def workers(self) -> set[int]:
        """The supervisor's child processes."""
        return {pid for pid in _pids() if _parent_of(pid) == self.process.pid}


def embedded_env(directory: Path, upstream: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{directory / 'gateway.db'}", "REDIS_URL": "",
        "VENICE_API_KEY": "sk-fake-upstream", "VENICE_BASE_URL": upstream,
        "ADMIN_BIND_ADDR": f"127.0.0.1:{free_port()}", "ACCESS_LOG": "off", **extra,
    }


@contextlib.contextmanager
def serve(directory: Path, env: dict[str, str], *args: str) -> Iterator[Served]:
    port = free_port()
    output = directory / "serve.log"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [str(BIN / "llm-gateway"), "serve", *args],
            env={**env, "BIND_ADDR": f"127.0.0.1:{port}"}, stdout=sink,
            stderr=subprocess.STDOUT, text=True)
    served = Served(f"http://127.0.0.1:{port}", process, output, env["DATABASE_URL"])
    try:
        wait_until_up(served.url + "/healthz", process, timeout=30)
        yield served
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory,
            fake_server: tuple[FakeUpstream, str]) -> Iterator[Served]:
    """`serve --workers 2` on the embedded default, for the steps of
    ``test_two_workers_through_their_life`` (the last one stops it)."""
    directory = tmp_path_factory.mktemp("workers")
    with serve(directory, embedded_env(directory, fake_server[1]), "--workers", "2") as served:
        served.wait_for_log(r"worker 1 serving")
        yield served


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def connections_held(pid: int, port: int) -> int:
    """The established connections to ``port`` that process ``pid`` holds: the clients
    it accepted (Linux /proc; the test's own client ends are on other ports)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    held = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if fields[3] == "01" and local_port == port and fields[9] in inodes:
            held += 1
    return held


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def post(url: str, key: str, body: dict[str, Any],
               ) -> tuple[Answer, asyncio.StreamWriter]:
    """One request on a connection of its own, left open. A bare h11 client: httpx's pool
    spends seconds of CPU on 400 connections at once, and the burst must be a burst."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    client = h11.Connection(h11.CLIENT)
    data = json.dumps(body).encode()
    writer.write(client.send(h11.Request(method="POST", target="/v1/chat/completions", headers=[
        ("host", host), ("authorization", f"Bearer {key}"),
        ("content-type", "application/json"), ("content-length", str(len(data)))]))
        + client.send(h11.Data(data=data)) + client.send(h11.EndOfMessage()))
    status, headers, chunks = 0, {}, []
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {name.decode(): value.decode() for name, value in event.headers}
        elif isinstance(event, h11.Data):
            chunks.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return Answer(status, headers, b"".join(chunks)), writer


def burst(url: str, key: str, count: int, body: dict[str, Any],
          while_open: Callable[[], None] | None = None) -> list[Answer]:
    """``count`` requests at once, each on a connection of its own; ``while_open`` is
    called before the connections close."""

    async def send() -> list[Answer]:
        sent = await asyncio.gather(*(post(url, key, body) for _ in range(count)))
        if while_open is not None:
            while_open()
        for _, writer in sent:
            writer.close()
        return [answer for answer, _ in sent]

    return asyncio.run(send())


# ---- exact across workers ---------------------------------------------------------------

def two_workers_admit_exactly_the_limit_of_400_concurrent_requests(
        workers: Served) -> None:
    record, key = create_key(workers.database_url, name="burst", rate_limit_requests=100,
                             rate_limit_window_seconds=roomy_window())
    workers.keys["burst"] = key
    port = int(workers.url.rsplit(":", 1)[1])
    held: dict[int, int] = {}

    def count_connections() -> None:
        held.update({pid: connections_held(pid, port) for pid in workers.workers()})

    responses = burst(workers.url, key, 400, CHAT, count_connections)
    statuses = collections.Counter(response.status_code for response in responses)
    assert statuses == {200: 100, 429: 300}
    for response in responses:
        if response.status_code == 429:
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"])
                       for r in responses if r.status_code == 200)
    assert remaining == list(range(100))  # each admitted request had its own count
    # Forked workers draw their own ids: no two answers share a request or trace id.
    for header in ("x-request-id", "x-trace-id"):
        assert len({response.headers[header] for response in responses}) == 400
    # Both workers answered: each holds some of the 400 client connections.
    assert len(held) == 2 and all(held.values()), held
    workers.admitted[record.id] += 100


def a_budget_holds_exactly_across_workers(workers: Served) -> None:
    # Each request reserves its prompt estimate (8) plus max_tokens (16) and really uses
    # as much, so 10 fit a budget of 240 tokens whatever the order of reserve and settle.
    record, key = create_key(workers.database_url, name="budget", rate_limit_requests=1000)
    set_budget(workers.database_url, BudgetScope.KEY, record.id, daily_tokens=240)
    body = {**CHAT, "max_tokens": 16,
            "messages": [{"role": "user", "content": "a a a a a a a a"}]}
    responses = burst(workers.url, key, 40, body)
    statuses = collections.Counter(response.status_code for response in responses)
    assert statuses == {200: 10, 429: 30}
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 429} == {
        "insufficient_quota"}
    assert {r.json()["usage"]["total_tokens"] for r in responses if r.status_code == 200} == {24}
    workers.admitted[record.id] += 10


def a_dead_worker_is_replaced_and_sighup_replaces_every_worker(workers: Served) -> None:
    record, workers.keys["after"] = create_key(workers.database_url, name="after",
                                               rate_limit_requests=1000)
    before = workers.workers()
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    workers.wait_for_log(rf"pid {victim}\) exited with status -9")
    deadline = time.monotonic() + 30
    while len(now := workers.workers()) != 2 or victim in now:
        assert time.monotonic() < deadline, workers.log()
        time.sleep(0.05)
    [replacement] = now - before
    workers.wait_for_log(rf"serving \(pid {replacement}\)")

    workers.process.send_signal(signal.SIGHUP)
    workers.wait_for_log("SIGHUP: every worker replaced")
    deadline = time.monotonic() + 30
    while workers.workers() & now:  # the old ones stop once their replacements serve
        assert time.monotonic() < deadline, workers.log()
        time.sleep(0.05)
    for name, status in (("after", 200), ("burst", 429)):
        # The counters outlive the workers: the first step's key is still at its limit.
        response = httpx.post(workers.url + "/v1/chat/completions", json=CHAT, timeout=30,
                              headers={"authorization": f"Bearer {workers.keys[name]}"})
        assert response.status_code == status
    workers.admitted[record.id] += 1


def sigterm_stops_every_worker_cleanly_with_one_usage_record_per_admitted_request(
        workers: Served, fake_server: tuple[FakeUpstream, str]) -> None:
    fake = fake_server[0]
    record, key = create_key(workers.database_url, name="in-flight", rate_limit_requests=1000)
    slow = {"x-fake-chunks": "4", "x-fake-chunk-delay-ms": "250"}
    pids = workers.workers()
    seen = len(fake.requests)

    async def in_flight() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            sent = [asyncio.create_task(client.post(
                workers.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                headers={"authorization": f"Bearer {key}", **slow})) for _ in range(6)]
            deadline = time.monotonic() + 30
            while len(fake.requests) < seen + 6:  # every one has reached the upstream
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            workers.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*sent)

    responses = asyncio.run(in_flight())
    assert workers.process.wait(30) == 0, workers.log()
    assert [r.status_code for r in responses] == [200] * 6
    assert all(r.text.rstrip().endswith("data: [DONE]") for r in responses)
    workers.admitted[record.id] += 6
    exits = dict(re.findall(r"\(pid (\d+)\) exited with status (-?\d+)", workers.log()))
    assert {int(pid): int(exits[str(pid)]) for pid in pids} == dict.fromkeys(pids, 0)
    records = usage_records(workers.database_url)
    assert len({r.request_id for r in records}) == len(records)
    # Failed twice in CI's Postgres pass at stop 22 (5 and 4 of these 6 records missing,
    # every worker exited 0), never alone: the workers' log says what their last flush did.
    assert collections.Counter(r.key_id for r in records) == workers.admitted, (
        workers.log()[-6000:])


def test_two_workers_through_their_life(workers: Served,
                                        fake_server: tuple[FakeUpstream, str]) -> None:
    """One `serve --workers 2`, step by step; each step reads what the ones before left (the
    burst key still at its limit after the workers were replaced; every admitted request's
    record at the end), so they are one test: a parallel runner never splits them."""
    two_workers_admit_exactly_the_limit_of_400_concurrent_requests(workers)
    a_budget_holds_exactly_across_workers(workers)
    a_dead_worker_is_replaced_and_sighup_replaces_every_worker(workers)
    sigterm_stops_every_worker_cleanly_with_one_usage_record_per_admitted_request(
        workers, fake_server)


# ---- the kernel spreads connections across workers ---------------------------------------

SPREAD_CONNECTIONS = 256


async def _hold_keep_alive(url: str) -> asyncio.StreamWriter:
    """A connection that asked one keep-alive request and is left open."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /healthz HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    assert length, head
    await reader.readexactly(int(length.group(1)))
    return writer


@pytest.mark.slow_once  # a `serve --workers 2` of its own; the database is the embedded one
def test_two_workers_each_hold_their_share_of_connections_opened_at_once(
        tmp_path: Path, fake_url: str) -> None:
    """SO_REUSEPORT (Linux): one socket per worker, the kernel picks one per connection by
    a hash of its addresses and ports. With one shared socket the first worker awake
    accepted all of 64 connections opened at once in the benchmark; here it split 256 about
    100 to 156 (3 runs of 3 outside the bound), while 64 and 384 at once landed within it.
    The issue's target: within 20 % of an even share. The hash makes each worker's count
    binomial (n, 1/2): with 64 connections 20 % (±6.4) is 1.6 sigma, missed about one run
    in nine; with 256, 20 % of 128 (±25.6) is 3.2 sigma (sigma 8), missed about one run in
    700 by chance alone."""
    env = embedded_env(tmp_path, fake_url)
    with serve(tmp_path, env, "--workers", "2") as served:
        served.wait_for_log(r"worker 1 serving")
        port = int(served.url.rsplit(":", 1)[1])

        async def open_and_count() -> dict[int, int]:
            writers = await asyncio.gather(
                *(_hold_keep_alive(served.url) for _ in range(SPREAD_CONNECTIONS)))
            try:
                return {pid: connections_held(pid, port) for pid in served.workers()}
            finally:
                for writer in writers:
                    writer.close()

        held = asyncio.run(open_and_count())
        # SO_REUSEPORT would let a second gateway of the same user join the group and
        # take a share: it fails as on a taken port instead.
        second = subprocess.run(
            [str(BIN / "llm-gateway"), "serve", "--workers", "2"], capture_output=True,
            text=True, timeout=30, env={**embedded_env(tmp_path / "second", fake_url),
                                        "BIND_ADDR": f"127.0.0.1:{port}"})
        assert second.returncode == 3, second
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr + second.stdout
    # At least: a connection of the start-up's health check can linger on a worker.
    assert len(held) == 2 and sum(held.values()) >= SPREAD_CONNECTIONS, held
    share = SPREAD_CONNECTIONS / 2
    assert all(abs(count - share) <= 0.2 * share for count in held.values()), held


# ---- one process: SIGHUP reloads the routes ------------------------------------------------

def test_sighup_reloads_the_route_file_and_the_process_stays_up(
        tmp_path: Path, fake_url: str) -> None:
    config = tmp_path / "gateway.yaml"

    def write_routes(model: str) -> None:
        routes = {"providers": {"p": {"base_url": fake_url, "api_key_env": "WORKERS_TEST_KEY",
                                      "profile": "venice"}},
                  "models": {"chat": {"targets": [{"provider": "p", "model": model}]}}}
        config.with_suffix(".new").write_text(yaml.safe_dump(routes))
        config.with_suffix(".new").replace(config)  # in one step, as the README says

    write_routes("m1")
    env = embedded_env(tmp_path, fake_url, LLM_GATEWAY_CONFIG=str(config),
                       WORKERS_TEST_KEY="sk-fake-upstream")
    with serve(tmp_path, env) as served:
        _, key = create_key(served.database_url)

        def upstream() -> str:
            response = httpx.post(served.url + "/v1/chat/completions",
                                  json={**CHAT, "model": "chat"},
                                  headers={"authorization": f"Bearer {key}"})
            return response.headers["x-llm-gateway-upstream"]

        assert upstream() == "p/m1"
        write_routes("m2")
        served.process.send_signal(signal.SIGHUP)
        served.wait_for_log("SIGHUP: looking at the routes again")
        served.wait_for_log("routes: version 2 in force")
        assert upstream() == "p/m2"
        served.process.send_signal(signal.SIGHUP)  # nothing changed: nothing happens
        assert len(served.wait_for_log("SIGHUP: looking at the routes again")) >= 1
        assert upstream() == "p/m2" and served.process.poll() is None
        assert "worker 0 starting" not in served.log()  # one process: no supervisor
        served.process.terminate()
        assert served.process.wait(30) == 0


# ---- the setting ---------------------------------------------------------------------------

def test_workers_auto_is_the_usable_cpus_bounded_by_the_cgroup_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert load_settings({"WORKERS": "auto"}).workers == usable_cpus() >= 1
    assert load_settings({}).workers == 1 and load_settings({"WORKERS": "3"}).workers == 3
    cpu_max = tmp_path / "cpu.max"
    for quota, expected in (("max 100000", affinity), ("50000 100000", 1),
                            ("100000 100000", 1), ("800000 100000", min(affinity, 8))):
        cpu_max.write_text(quota + "\n")
        assert usable_cpus(cpu_max) == expected, quota


def test_a_bad_worker_count_stops_start_up_with_one_line_and_status_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = subprocess.run(
        [str(BIN / "llm-gateway"), "serve"], capture_output=True, text=True, timeout=30,
        env={**embedded_env(tmp_path, "http://127.0.0.1:1"), "WORKERS": "abc"})
    assert (result.returncode, result.stderr.strip()) == (
        2, "llm-gateway: WORKERS: expected a number of processes or auto, got 'abc'")
    # The same parser, the same one line, for 0 and for the flag (which wins).
    with pytest.raises(ConfigError, match=r"^WORKERS: must be >= 1 \(or auto\), got 0$"):
        load_settings({"WORKERS": "0"})
    args = build_parser().parse_args(["serve", "--workers", "0"])
    with pytest.raises(ConfigError, match=r"^--workers: must be >= 1 \(or auto\), got 0$"):
        serve_settings(args)
    monkeypatch.setenv("VENICE_API_KEY", "sk-test")
    args = build_parser().parse_args(["serve", "--workers", "auto"])
    assert serve_settings(args).workers == usable_cpus()


# ---- the workers' file, in process: the same rules as in memory ----------------------------

async def test_the_sqlite_limiter_decides_as_the_memory_limiter(tmp_path: Path) -> None:
    clock = [1_800_000_000.0]
    file = WorkersFile(tmp_path / "w.db")
    limiters = (MemoryRateLimiter(lambda: clock[0]),
                SqliteRateLimiter(file, lambda: clock[0]))
    guard = Guard("failed:k", 2, 60)
    steps: list[tuple[str, int, Guard | None]] = [
        ("k", 1, guard), ("k", 1, guard), ("k", 0, None), ("k", 1, guard), ("k", 0, None),
        ("failed:k", 1, None), ("failed:k", 1, None), ("k", 1, guard), ("other", 1, None)]
    for key_id, cost, guarded_by in steps:
        decisions = [await limiter.take(key_id, 2, 60, cost, guarded_by) for limiter in limiters]
        assert decisions[0] == decisions[1], (key_id, cost, guarded_by)
    clock[0] += 60  # a new window
    assert [(await limiter.take("k", 2, 60)).remaining for limiter in limiters] == [1, 1]
    await limiters[1].close()


async def test_the_sqlite_ledger_answers_as_the_memory_ledger(tmp_path: Path) -> None:
    clock = [1_800_000_000.0]
    ledgers = (MemoryLedger(lambda: clock[0]),
               SqliteLedger(WorkersFile(tmp_path / "w.db"), lambda: clock[0]))
    day = Hold("tok:key:k:d1", 100, 40, clock[0] + 3600)
    tpm = Draw("tpm:key:k", 90, 40)
    for _ in range(3):
        answers = [await ledger.reserve([day], [tpm]) for ledger in ledgers]
        assert answers[0] == answers[1]
    for ledger in ledgers:
        await ledger.settle([day], [10], [tpm], [10])
    clock[0] += 7.5  # the bucket refills a little
    answers = [await ledger.reserve([day], [tpm]) for ledger in ledgers]
    assert answers[0] == answers[1] and answers[0].granted
    await ledgers[1].close()


async def test_one_workers_failures_keep_the_other_off_the_target(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    policy = HealthPolicy()
    books = [HealthBook(policy), HealthBook(policy)]
    shared = [SharedHealth(SqliteEvidence(WorkersFile(path)), book, lambda: ["p/m"])
              for book in books]
    for _ in range(policy.failures_to_down):
        books[0].record("p/m", Outcome.CONNECT)
        shared[0].listener("p/m", Outcome.CONNECT, None, books[0].evidence("p/m"))
    await asyncio.sleep(0)
    await shared[0].close()  # waits for what it publishes
    await shared[1].refresh()
    assert books[1].state("p/m") is State.DOWN
    await shared[1].close()


async def test_one_workers_429_puts_the_target_in_cooldown_for_the_other(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    with sqlite3.connect(path) as old:  # a file made before the cooldown was shared
        old.execute("CREATE TABLE target_health (target TEXT PRIMARY KEY, failures INTEGER "
                    "NOT NULL, successes INTEGER NOT NULL, degraded INTEGER NOT NULL, "
                    "down_until REAL NOT NULL) WITHOUT ROWID")
        old.execute("INSERT INTO target_health VALUES ('p/old', 1, 0, 0, 0.0)")
    policy = HealthPolicy()
    books = [HealthBook(policy), HealthBook(policy)]
    shared = [SharedHealth(SqliteEvidence(WorkersFile(path)), book, lambda: ["p/m", "p/old"])
              for book in books]
    books[0].record("p/m", Outcome.RATE_LIMITED, retry_after=30)
    shared[0].listener("p/m", Outcome.RATE_LIMITED, 30, CLEAN)
    await asyncio.sleep(0)
    await shared[0].close()  # waits for what it publishes
    await shared[1].refresh()
    assert books[1].rate_limited(["p/m", "p/old"]) == {"p/m"}
    assert books[1].state("p/m") is not State.DOWN  # a 429 is a cooldown, never DOWN
    assert books[1].evidence("p/old").failures == 1  # the old file's rows are kept
    await shared[1].close()


# ---- settings carry their environment --------------------------------------------------------

def test_provider_keys_come_from_the_environment_the_settings_were_loaded_from(
        tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"providers": {"p": {
        "base_url": "http://127.0.0.1:1/api/v1", "api_key_env": "ONLY_IN_THIS_MAPPING"}}}))
    assert "ONLY_IN_THIS_MAPPING" not in os.environ
    settings = load_settings({"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}",
                              "ONLY_IN_THIS_MAPPING": "sk-from-the-mapping"}, str(config))
    assert "sk-from-the-mapping" not in repr(settings)
    gateway = build_gateway(settings)
    api_key = gateway.router.table.providers["p"].api_key
    assert api_key is not None and api_key.reveal() == "sk-from-the-mapping"
    asyncio.run(gateway.close())
