"""The chaos soak (`make soak-chaos`, not in CI): mixed JSON and streams at a steady rate
through `serve --workers 2` on a Postgres and a Redis of its own, while the fake upstream
injects errors and stalls (bench/chaos_upstream.py) and, on a schedule, Redis is killed
(SIGKILL) and started again, Postgres is restarted, and a worker is SIGKILLed.

    python -m bench.chaos [--seconds 600] [--rate 20]

At the end: requests sent, answers by kind, records against admitted requests (by
request id: each exactly once, once the spools are replayed), the budget's overshoot,
each worker's RSS with its slope, the gateway's log lines with a traceback. A table on
stdout, JSON in bench/results/chaos-<time>.json."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg

from bench.chaos_servers import Gateway, PrivatePostgres, PrivateRedis, faulty_upstream
from bench.chaos_tally import Answer, kinds, overshoot, records_check, rss_slopes, table
from bench.machine import describe_machine, machine_summary
from bench.procstat import rss_bytes

RESULTS = Path(__file__).parent / "results"
MODEL = "llama-3.3-70b"
# Per million tokens: dear enough that the capped key's budget runs out partway through.
PRICE_INPUT, PRICE_OUTPUT = "200", "800"
MAX_TOKENS = 64
# (key name, share of the traffic, rate limit): the capped key has the USD budget, the
# tight one a rate limit below what it is sent.
KEYS = (("steady", 0.5, "6000/60"), ("capped", 0.4, "6000/60"), ("tight", 0.1, "60/60"))
BUDGET_RUNS_OUT_AT = 0.4  # of the run, at the calibrated cost per request
DOWN_SECONDS = 5.0  # how long Redis and Postgres stay down


def chaos_schedule(seconds: float) -> list[tuple[float, str]]:
    """When (seconds into the load) each blow falls."""
    return [(seconds * 0.2, "kill redis"), (seconds * 0.45, "restart postgres"),
            (seconds * 0.7, "kill worker"), (seconds * 0.85, "kill redis")]


def gateway_env(redis: PrivateRedis, postgres: PrivatePostgres, upstream: str,
                directory: Path) -> dict[str, str]:
    return {
        "DATABASE_URL": postgres.url, "REDIS_URL": redis.url,
        "VENICE_BASE_URL": upstream, "VENICE_API_KEY": "sk-fake-upstream",
        "ADMIN_BIND_ADDR": "off", "USAGE_SPOOL_DIR": str(directory / "spool"),
        # Counters that cannot be reached refuse (503) rather than admit unbudgeted.
        "RATE_LIMIT_FAILURE_POLICY": "fail-closed",
        "REQUEST_TIMEOUT_SECONDS": "8", "ACCESS_LOG": "off", "LOG_FORMAT": "text",
    }


# ---- the load ----------------------------------------------------------------------------


async def _one(client: httpx.AsyncClient, url: str, key: tuple[str, str], stream: bool,
               at: float) -> Answer:
    name, secret = key
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": stream,
            "messages": [{"role": "user", "content": "Say something about chaos."}]}
    started = time.monotonic()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"authorization": f"Bearer {secret}"}) as response:
            raw = await response.aread()
    except httpx.HTTPError as failure:
        return Answer(name, stream, 0, type(failure).__name__, None, None, at,
                      time.monotonic() - started)
    request_id = response.headers.get("x-request-id")
    code, stream_error = _error_code(raw, response.status_code, stream)
    return Answer(name, stream, response.status_code, code, request_id, stream_error, at,
                  time.monotonic() - started)


def _error_code(raw: bytes, status: int, stream: bool) -> tuple[str | None, str | None]:
    """(the error's code of a refused answer, the code of a stream's error event)."""
    if status != 200:
        try:
            error = json.loads(raw).get("error", {})
            return (error.get("code") if isinstance(error, dict) else str(error)), None
        except (ValueError, AttributeError):
            return "(not JSON)", None
    if not stream:
        return None, None
    for line in raw.decode(errors="replace").splitlines():
        if line.startswith("data: {") and '"error"' in line:
            try:
                error = json.loads(line[6:]).get("error")
            except ValueError:
                return None, "(malformed event)"
            code = error.get("code") if isinstance(error, dict) else None
            return None, str(code or error)
    if "data: [DONE]" not in raw.decode(errors="replace"):
        return None, "(no [DONE])"
    return None, None


async def steady_load(url: str, keys: dict[str, str], seconds: float, rate: float,
                      stream_share: float, seed: int,
                      keys_shares: tuple[tuple[str, float], ...] | None = None
                      ) -> tuple[list[Answer], int]:
    """Open loop: a request every 1/rate s whatever the answers take; (answers, sent)."""
    chooser = random.Random(seed)
    shares = keys_shares or tuple((name, share) for name, share, _ in KEYS)
    names = [name for name, _ in shares]
    weights = [share for _, share in shares]
    tasks: list[asyncio.Task[Answer]] = []
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as client:
        started = time.monotonic()
        for sent in range(int(seconds * rate)):
            delay = started + sent / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            name = chooser.choices(names, weights)[0]
            stream = chooser.random() < stream_share
            tasks.append(asyncio.create_task(
                _one(client, url, (name, keys[name]), stream, sent / rate)))
        answers = list(await asyncio.gather(*tasks))
    return answers, len(tasks)


# ---- the blows and the RSS, beside the load ------------------------------------------------


class Chaos(threading.Thread):
    """Deals the schedule's blows, and samples each worker's RSS every ``every`` s."""

    def __init__(self, gateway: Gateway, redis: PrivateRedis, postgres: PrivatePostgres,
                 schedule: list[tuple[float, str]], every: float = 5.0) -> None:
        super().__init__(daemon=True, name="chaos")
        self.gateway, self.redis, self.postgres = gateway, redis, postgres
        self.pending = sorted(schedule)
        self.every = every
        self.events: list[dict[str, object]] = []
        self.rss: dict[int, list[tuple[float, int]]] = {}
        self.stopping = threading.Event()
        self.started_at = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.started_at

    def run(self) -> None:
        next_sample = 0.0
        while not self.stopping.is_set():
            if self.now() >= next_sample:
                for pid in self.gateway.workers():
                    self.rss.setdefault(pid, []).append((self.now(), rss_bytes(pid)))
                next_sample += self.every
            if self.pending and self.now() >= self.pending[0][0]:
                self._strike(self.pending.pop(0)[1])
            self.stopping.wait(0.2)

    def _strike(self, what: str) -> None:
        at = round(self.now(), 1)
        actions: dict[str, Callable[[], str]] = {
            "kill redis": self._kill_redis, "restart postgres": self._restart_postgres,
            "kill worker": self._kill_worker,
        }
        detail = actions[what]()
        self.events.append({"at_s": at, "what": f"{what}: {detail}"})
        print(f"[{at:7.1f} s] {what}: {detail}", flush=True)

    def _kill_redis(self) -> str:
        self.redis.kill()
        time.sleep(DOWN_SECONDS)
        self.redis.start()
        return f"SIGKILL, started again after {DOWN_SECONDS:.0f} s (append-only file kept)"

    def _restart_postgres(self) -> str:
        self.postgres.stop("fast")
        time.sleep(DOWN_SECONDS)
        self.postgres.start()
        return f"pg_ctl stop -m fast, started after {DOWN_SECONDS:.0f} s"

    def _kill_worker(self) -> str:
        victim = self.gateway.workers()[0]
        os.kill(victim, 9)
        deadline = time.monotonic() + 30
        while (len(now := self.gateway.workers()) != 2 or victim in now) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        return f"SIGKILL worker {victim}; workers now {now}"


# ---- the end: records, budget, log ---------------------------------------------------------


def records_by_request(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "SELECT request_id, count(*) FROM usage_records GROUP BY request_id").fetchall()
    return {str(request_id): int(count) for request_id, count in rows}


def settle_records(database_url: str, answers: list[Answer], patience: float = 120
                   ) -> dict[str, int]:
    """The records once every admitted answer has one, or they stop coming (spools replay
    within seconds of the store being back)."""
    deadline, last, quiet_since = time.monotonic() + patience, -1, time.monotonic()
    while True:
        records = records_by_request(database_url)
        if records_check(answers, records)["missing"] == 0 or time.monotonic() > deadline:
            return records
        if sum(records.values()) != last:
            last, quiet_since = sum(records.values()), time.monotonic()
        elif time.monotonic() - quiet_since > 30:
            return records
        time.sleep(2)


def budget_figures(gateway: Gateway, key_id: str, limit: Decimal, answers: list[Answer]
                   ) -> dict[str, object]:
    """The capped key's spend two ways: the ledger's (`budgets show`, what the budget
    charged) and its usage records' (`usage report`, spend_usd), each against the limit."""
    [shown] = [row for row in json.loads(gateway.cli("budgets", "show", "--json"))
               if row.get("scope_id") == key_id]
    ledger = Decimal(str(shown["spent_today_usd"]))
    rows = json.loads(gateway.cli("usage", "report", "--by", "key", "--format", "json"))
    recorded = sum((Decimal(str(row["spend_usd"])) for row in rows if row["key_id"] == key_id),
                   Decimal(0))
    refused = [a for a in answers if a.key == "capped" and a.code == "insufficient_quota"]
    first = min((a.at for a in refused), default=None)
    return {"limit_usd": str(limit), "spent_usd": str(ledger),
            "overshoot_usd": str(overshoot(ledger, limit)),
            "recorded_spend_usd": str(recorded),
            "recorded_overshoot_usd": str(overshoot(recorded, limit)),
            "refused_insufficient_quota": len(refused),
            "exhausted_after_s": None if first is None else round(first, 1),
            "shown": shown}


def tracebacks(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines()
            if "Traceback (most recent call last)" in line]


# ---- the run -------------------------------------------------------------------------------


def _setup_keys(gateway: Gateway) -> dict[str, dict[str, str]]:
    gateway.cli("prices", "set", "--provider", "venice", "--model", MODEL,
                "--input", PRICE_INPUT, "--output", PRICE_OUTPUT)
    made = {}
    for name, _, rate_limit in KEYS:
        created = json.loads(gateway.cli("keys", "create", "--name", name,
                                         "--rate-limit", rate_limit, "--json"))
        made[name] = {"id": str(created["id"]), "key": str(created["key"])}
    return made


def _cost_per_request(gateway: Gateway, keys: dict[str, dict[str, str]]
                      ) -> tuple[Decimal, list[Answer]]:
    """What one answered request of the load costs, from a few sent before it (and their
    answers: recorded too)."""
    secret = {"steady": keys["steady"]["key"]}
    answers, _ = asyncio.run(steady_load(gateway.url, secret, 4, 2.5, 0.5, seed=99,
                                         keys_shares=(("steady", 1.0),)))
    settle_records(gateway.env["DATABASE_URL"], answers, patience=30)
    rows = json.loads(gateway.cli("usage", "report", "--by", "key", "--format", "json"))
    [row] = [r for r in rows if r["key_id"] == keys["steady"]["id"]]
    served = int(row["requests"]) - int(row["errors"])
    if served <= 0:
        raise RuntimeError(f"no calibration request was served: {row}")
    return Decimal(str(row["cost_usd"])) / served, answers


def soak(seconds: float, rate: float, stream_share: float, seed: int) -> dict[str, object]:
    directory = Path(tempfile.mkdtemp(prefix="llmg-chaos-"))
    redis, postgres = PrivateRedis(directory), PrivatePostgres(directory)
    upstream = None
    gateway: Gateway | None = None
    try:
        redis.start()
        postgres.init()
        upstream, upstream_url = faulty_upstream(seed)
        gateway = Gateway(directory, gateway_env(redis, postgres, upstream_url, directory))
        keys = _setup_keys(gateway)
        gateway.start()
        per_request, calibration = _cost_per_request(gateway, keys)
        capped_share = dict((name, share) for name, share, _ in KEYS)["capped"]
        limit = (per_request * Decimal(str(rate * capped_share * seconds * BUDGET_RUNS_OUT_AT))
                 ).quantize(Decimal("0.0001"))
        gateway.cli("budgets", "set", "--key", keys["capped"]["id"], "--daily-usd", str(limit))
        time.sleep(2.5)  # every process's budget cache (2 s) has the new budget
        print(f"calibrated: {per_request:.6f} USD a request; the capped key's budget "
              f"{limit} USD; load for {seconds:.0f} s at {rate} req/s", flush=True)
        chaos = Chaos(gateway, redis, postgres, chaos_schedule(seconds))
        chaos.start()
        answers, sent = asyncio.run(steady_load(
            gateway.url, {name: made["key"] for name, made in keys.items()}, seconds, rate,
            stream_share, seed))
        chaos.stopping.set()
        chaos.join(60)
        records = settle_records(postgres.url, answers + calibration)
        budget = budget_figures(gateway, keys["capped"]["id"], limit, answers)
        exit_status = gateway.stop()
        records = records_by_request(postgres.url)  # the clean shutdown's flush too
        return {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": describe_machine(), "seconds": seconds, "rate": rate,
            "stream_share": stream_share, "seed": seed, "requests": sent,
            "answers": kinds(answers), "calibration_requests": len(calibration),
            "records_check": records_check(answers + calibration, records),
            "budget": budget, "cost_per_request_usd": str(per_request),
            "events": chaos.events, "rss": rss_slopes(chaos.rss),
            "tracebacks": len(tracebacks(gateway.log)), "serve_exit_status": exit_status,
            "traceback_lines": tracebacks(gateway.log)[:20],
            "answers_each": [asdict(a) for a in answers],
        }
    finally:
        if gateway is not None and gateway.process is not None \
                and gateway.process.poll() is None:
            gateway.stop()
        if upstream is not None:
            upstream.kill()
        redis.kill()
        with contextlib.suppress(RuntimeError):  # stopped already
            postgres.stop("immediate")
        _keep_log_and_clean(directory)


def _keep_log_and_clean(directory: Path) -> None:
    """The gateway's log into bench/results/ (beside the JSON), the rest removed."""
    RESULTS.mkdir(exist_ok=True)
    if (directory / "serve.log").exists():
        shutil.copy(directory / "serve.log", RESULTS / "chaos-serve-last.log")
    shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600, help="how long the load runs")
    parser.add_argument("--rate", type=float, default=20, help="requests a second")
    parser.add_argument("--stream-share", type=float, default=0.5,
                        help="the share of the requests that stream")
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args(argv)
    figures = soak(arguments.seconds, arguments.rate, arguments.stream_share, arguments.seed)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"chaos-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(figures, indent=2, default=str))
    print(f"\nChaos soak, {figures['when']}, {machine_summary(figures['machine'])}\n")
    print(table(figures))
    print(f"\nJSON: {out}")


if __name__ == "__main__":
    main()
