"""The processes a run needs: the fake upstream, and each target, started and stopped in turn.

Every target is its own process, started the way a user starts it (the `llm-gateway` and
`litellm` commands), on a free loopback port, pinned to the CPUs the plan gives targets.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.client import Endpoint, RequestSpec, wait_for_http
from bench.litellm_env import LITELLM_VERSION, LiteLLMUnavailable, litellm_command, write_config
from bench.procstat import raise_fd_limit

BIN = Path(sys.executable).parent
LLM_GATEWAY = str(BIN / "llm-gateway")
FAKE_API_KEY = "sk-fake-upstream"
FAKE_API_ROOT = "/api/v1"
LITELLM_MASTER_KEY = "sk-bench-litellm-master-key"
# The provider host an app behind the regular-mode sidecar calls; the sidecar intercepts it
# (it is one of the engine's LLM hosts) and forwards to VENICE_BASE_URL, the fake upstream.
# Nothing ever resolves it: the client asks the proxy to CONNECT by name.
REGULAR_MODE_HOST = "api.venice.ai"
START_TIMEOUT_SECONDS = 60.0

# Rows of the table, in the order they are measured. serve, serve-budget and the sidecars name
# the alias ROUTED_MODEL (two providers, 70/30, both the fake upstream): routing is on the
# measured path. serve-legacy is the single-provider set-up of VENICE_* alone, serve-redis
# serve with its rate limit in Redis and no budget (the budget phase runs it anyway); neither
# is a row unless named (--targets).
TARGET_NAMES = ("direct", "serve", "serve-legacy", "serve-redis", "serve-budget",
                "sidecar-reverse", "sidecar-regular", "litellm")
DEFAULT_TARGETS = tuple(name for name in TARGET_NAMES
                        if name not in ("serve-legacy", "serve-redis"))
GATEWAY_TARGETS = TARGET_NAMES[1:]
# The model name sent to the upstream and to the legacy gateway; LiteLLM maps its own aliases
# (see litellm_env).
FAST_MODEL = "llama-3.3-70b"
# The alias routed gateways are called with, and its two targets: (provider, model, weight).
ROUTED_MODEL = "chat-fast"
ROUTED_TARGETS = (("fake-a", "llama-3.3-70b", 70), ("fake-b", "qwen3-4b", 30))
# Tokens per content chunk of the fake upstream: a stream's max_tokens must cover its chunks.
TOKENS_PER_CHUNK = 8


class TargetUnavailable(Exception):
    """The target cannot run here; the run reports why and goes on with the others."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prepare_child(cpus: Sequence[int] | None):  # type: ignore[no-untyped-def]
    """The child's preexec: the file-descriptor limit, and its CPUs."""
    chosen = set(cpus) if cpus else None

    def prepare() -> None:
        raise_fd_limit()
        if chosen:
            os.sched_setaffinity(0, chosen)

    return prepare


@dataclass
class ManagedProcess:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        # The whole group: a launcher (litellm, uvicorn workers) may have children.
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


def start_process(
    name: str, command: list[str], env: dict[str, str], workdir: Path,
    cpus: Sequence[int] | None,
) -> ManagedProcess:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log_file:
        popen = subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=workdir,
            preexec_fn=_prepare_child(cpus), start_new_session=True,
        )
    return ManagedProcess(name, popen, log_path)


def _wait_until_answering(
    process: ManagedProcess, endpoint: Endpoint, probe: RequestSpec, expect: int = 200
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    status = None
    while time.monotonic() < deadline:
        if not process.alive():
            raise TargetUnavailable(
                f"{process.name} exited with status {process.popen.returncode}: "
                f"{process.log_tail(8)}"
            )
        try:
            status = asyncio.run(wait_for_http(endpoint, probe, 1.0))
        except TimeoutError:
            continue
        if status == expect:
            return
        time.sleep(0.2)
    process.stop()
    raise TargetUnavailable(
        f"{process.name} did not answer {expect} within {START_TIMEOUT_SECONDS:.0f}s "
        f"(last status {status}): {process.log_tail(8)}"
    )


# ---- what a target is -----------------------------------------------------------------------


@dataclass
class Target:
    """A started target: where to send requests, as whom, and the process to watch."""

    name: str
    endpoint: Endpoint
    api_path: str  # the chat completions path on the endpoint
    authorization: str
    process: ManagedProcess | None  # None for direct: the fake upstream is not measured
    fast_model: str = FAST_MODEL
    # LiteLLM does not forward unknown request headers; it gets stream shapes as aliases.
    stream_models: dict[tuple[int, int], str] = field(default_factory=dict)
    version: str | None = None
    notes: list[str] = field(default_factory=list)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def chat_request(
        self, *, stream_shape: tuple[int, int] | None = None, content: str = "Say hello."
    ) -> RequestSpec:
        """A chat completion: fast (JSON) or a stream of ``(chunks, delay_ms)``."""
        payload: dict[str, object] = {
            "model": self.fast_model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 64,
        }
        headers = [("content-type", "application/json"), ("authorization", self.authorization)]
        if stream_shape is not None:
            payload["stream"] = True
            payload["model"] = self.stream_models.get(stream_shape, self.fast_model)
            chunks, delay_ms = stream_shape
            # The fake answers no more chunks than max_tokens pays for (as a real model).
            payload["max_tokens"] = max(64, chunks * TOKENS_PER_CHUNK)
            # The fake upstream reads these; the gateways forward unknown headers untouched.
            headers += [("x-fake-chunks", str(chunks)), ("x-fake-chunk-delay-ms", str(delay_ms))]
        body = json.dumps(payload, separators=(",", ":")).encode()
        return RequestSpec("POST", self.api_path, tuple(headers), body)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        for step in self.cleanup:
            step()
        self.cleanup.clear()


# Settings from the harness's environment that would change what a target is: every target
# gets the embedded defaults for these unless the harness sets one on purpose. (Others, such
# as ACCESS_LOG, pass through: a caller of the harness may choose them.)
_INHERITED_SETTINGS = ("REDIS_URL", "REDIS_NAMESPACE", "OTEL_EXPORTER_OTLP_ENDPOINT",
                       "LLM_GATEWAY_CONFIG", "WORKERS", "ADMIN_BIND_ADDR")


def _access_log_note(env: dict[str, str]) -> str:
    value = env.get("ACCESS_LOG")
    return (f"access log {value}" if value else "access log json (the default)") + \
        ", to its log file"


def write_routes(path: Path, base_url: str) -> Path:
    """The settings file of routed targets: two providers with different names, both the
    upstream at ``base_url``, and the alias ROUTED_MODEL split 70/30 between them (JSON is
    YAML)."""
    document = {
        "providers": {name: {"base_url": base_url, "api_key_env": "VENICE_API_KEY",
                             "profile": "venice"} for name, _, _ in ROUTED_TARGETS},
        "models": {ROUTED_MODEL: {"targets": [
            {"provider": name, "model": model, "weight": weight}
            for name, model, weight in ROUTED_TARGETS]}},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


@dataclass
class Environment:
    """What every target shares: the fake upstream, a gateway key, scratch space, CPUs."""

    workdir: Path
    fake_port: int
    fake_process: ManagedProcess
    gateway_key: str
    database_url: str
    target_cpus: list[int] | None
    load_cpus: list[int] | None
    stream_shapes: list[tuple[int, int]]
    routes_path: Path | None = None

    @property
    def fake_base_url(self) -> str:
        return f"http://127.0.0.1:{self.fake_port}{FAKE_API_ROOT}"

    def gateway_env(self, *, routed: bool = False) -> dict[str, str]:
        """A gateway's environment: the embedded defaults (in-process limits, SQLite, access
        log as configured by default), the fake upstream as provider, the admin listener off
        (several gateways may run at once), and with ``routed`` the two-provider alias (the
        run's targets; the default stays the single provider, for bench.inprocess)."""
        env = {k: v for k, v in os.environ.items() if not k.endswith("_PROXY")
               and not k.endswith("_proxy") and k not in _INHERITED_SETTINGS}
        env.update({
            "DATABASE_URL": self.database_url,
            "VENICE_API_KEY": FAKE_API_KEY,
            "VENICE_BASE_URL": self.fake_base_url,
            "ADMIN_BIND_ADDR": "off",
            "PYTHONUNBUFFERED": "1",
        })
        if routed:
            if self.routes_path is None:
                self.routes_path = write_routes(
                    self.workdir / f"routes-{self.fake_port}.yaml", self.fake_base_url)
            env["LLM_GATEWAY_CONFIG"] = str(self.routes_path)
        return env


def create_key(database_url: str, name: str = "bench", routes: Path | None = None) -> dict:
    """A gateway key with a rate limit it cannot reach; the CLI's JSON (``key``, ``prefix``)."""
    env = {**os.environ, "DATABASE_URL": database_url}
    if routes is not None:
        env["LLM_GATEWAY_CONFIG"] = str(routes)
    created = subprocess.run(
        [LLM_GATEWAY, "keys", "create", "--name", name, "--rate-limit", "100000000/60",
         "--json"],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )
    if created.returncode != 0:
        raise RuntimeError(f"`llm-gateway keys create` failed: {created.stderr[-400:]}")
    return json.loads(created.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def start_environment(
    workdir: Path, *, target_cpus: list[int] | None, load_cpus: list[int] | None,
    stream_shapes: list[tuple[int, int]],
) -> Environment:
    """Start the fake upstream (on the load CPUs) and create a gateway key."""
    raise_fd_limit()
    fake_port = free_port()
    fake = start_process(
        "fake-upstream",
        [LLM_GATEWAY, "fake-upstream", "--listen", f"127.0.0.1:{fake_port}",
         "--chunks", "8", "--chunk-delay", "0"],
        {**os.environ, "PYTHONUNBUFFERED": "1"}, workdir, load_cpus,
    )
    probe = RequestSpec("GET", f"{FAKE_API_ROOT}/models",
                        (("authorization", f"Bearer {FAKE_API_KEY}"),), b"")
    _wait_until_answering(fake, Endpoint("127.0.0.1", fake_port), probe)

    database_url = f"sqlite:///{workdir / 'gateway.db'}"
    try:
        key = create_key(database_url)["key"]
    except RuntimeError:
        fake.stop()
        raise
    environment = Environment(workdir, fake_port, fake, key, database_url, target_cpus,
                              load_cpus, stream_shapes)
    environment.routes_path = write_routes(workdir / "routes.yaml", environment.fake_base_url)
    return environment


def direct_target(environment: Environment) -> Target:
    return Target(
        name="direct",
        endpoint=Endpoint("127.0.0.1", environment.fake_port),
        api_path=f"{FAKE_API_ROOT}/chat/completions",
        authorization=f"Bearer {FAKE_API_KEY}",
        process=None,
    )


def _gateway_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"llm-gateway {version('llm-gateway')}"
    except PackageNotFoundError:
        return "llm-gateway (not installed)"


def _routing_note(routed: bool) -> str:
    if not routed:
        return "single provider (VENICE_* only, no alias), model llama-3.3-70b"
    split = "/".join(str(weight) for _, _, weight in ROUTED_TARGETS)
    return (f"alias {ROUTED_MODEL}: {len(ROUTED_TARGETS)} providers, {split}, both the fake "
            "upstream")


def _serve_flags_supported(flags: Sequence[str]) -> str | None:
    """None when `llm-gateway serve` takes every flag of ``flags``, else why not."""
    if not flags:
        return None
    try:
        completed = subprocess.run([LLM_GATEWAY, "serve", "--help"], capture_output=True,
                                   text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`llm-gateway serve --help` failed: {exc}"
    missing = [flag for flag in flags if flag.startswith("--") and flag not in completed.stdout]
    if completed.returncode != 0 or missing:
        return (f"`llm-gateway serve` has no {', '.join(missing) or 'help'} in this checkout "
                f"(exit {completed.returncode})")
    return None


def start_serve(
    environment: Environment, *, name: str = "serve", routed: bool = False,
    extra_env: dict[str, str] | None = None, flags: Sequence[str] = (),
    database_url: str | None = None, key: str | None = None, cpus: Sequence[int] | None = None,
    use_target_cpus: bool = True, notes: Sequence[str] = (),
) -> Target:
    """``llm-gateway serve [flags]`` on a free port; the alias with ``routed`` (every target
    and phase of the run), else the single provider (bench.inprocess's default)."""
    if (reason := _serve_flags_supported(flags)) is not None:
        raise TargetUnavailable(reason)
    port = free_port()
    env = {**environment.gateway_env(routed=routed), "BIND_ADDR": f"127.0.0.1:{port}",
           **(extra_env or {})}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    chosen_cpus = cpus if cpus is not None else (
        environment.target_cpus if use_target_cpus else None)
    process = start_process(name, [LLM_GATEWAY, "serve", *flags], env, environment.workdir,
                            chosen_cpus)
    endpoint = Endpoint("127.0.0.1", port)
    _wait_until_answering(process, endpoint, RequestSpec("GET", "/healthz", (), b""))
    return Target(name, endpoint, "/v1/chat/completions",
                  f"Bearer {key or environment.gateway_key}", process,
                  fast_model=ROUTED_MODEL if routed else FAST_MODEL,
                  version=_gateway_version(),
                  notes=[f"{' '.join(['llm-gateway serve', *flags])}: uvicorn, "
                         f"{_access_log_note(env)}", _routing_note(routed), *notes])


# ---- serve with Redis, prices and a budget --------------------------------------------------

DEFAULT_BENCH_REDIS_URL = "redis://127.0.0.1:6379/0"
# USD per million tokens set for both targets of the alias (the fake's own Venice prices).
BENCH_PRICES = ("0.70", "2.80")


def _redis_url() -> str:
    return os.environ.get("BENCH_REDIS_URL") or DEFAULT_BENCH_REDIS_URL


def _redis_reachable(url: str) -> str | None:
    """None when Redis answers PING at ``url``, else why not."""
    try:
        import redis
    except ImportError:
        return "the redis package is not installed"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any failure means: no Redis for this run
        return f"Redis at {url} does not answer: {type(exc).__name__}: {exc}"
    return None


def _forget_namespace(url: str, namespace: str) -> None:
    """Delete what the run left in Redis under its namespace (best effort)."""
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        try:
            keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
    except Exception:  # a leftover namespace expires or stays harmlessly
        pass


def _cli(args: Sequence[str], env: dict[str, str]) -> str:
    completed = subprocess.run([LLM_GATEWAY, *args], env=env, capture_output=True, text=True,
                               check=False, timeout=60)
    if completed.returncode != 0:
        raise TargetUnavailable(f"`llm-gateway {' '.join(args[:2])}` failed: "
                                f"{(completed.stderr or completed.stdout)[-300:]}")
    return completed.stdout


def start_serve_redis(environment: Environment, *, name: str = "serve-redis",
                      extra_env: dict[str, str] | None = None) -> Target:
    """serve with its rate limit in Redis and nothing else of serve-budget (no prices, no
    budget): what the Redis round trip alone costs, so that the budget phase can tell it
    from what the budget itself adds."""
    url = (extra_env or {}).get("REDIS_URL") or _redis_url()
    if (reason := _redis_reachable(url)) is not None:
        raise TargetUnavailable(reason)
    namespace = f"llmg-bench-{name}-{os.getpid()}-{int(time.time())}"
    target = start_serve(environment, name=name, routed=True,
                         extra_env={"REDIS_URL": url, "REDIS_NAMESPACE": namespace,
                                    **(extra_env or {})},
                         notes=[f"Redis {url} (namespace {namespace}): rate limit only"])
    target.cleanup.append(lambda: _forget_namespace(url, namespace))
    return target


def start_serve_budget(environment: Environment, *, name: str = "serve-budget",
                       extra_env: dict[str, str] | None = None) -> Target:
    """serve with Redis (limits and budgets shared there), prices for both targets of the
    alias, and a key with a daily USD budget and a tokens-per-minute limit it cannot reach;
    its own database (named after ``name``), so that the plain serve has neither prices nor
    budgets, and two of these (bench.ab) have one each."""
    # A caller's REDIS_URL (bench.ab's --new-env) is the Redis checked, used and cleaned.
    url = (extra_env or {}).get("REDIS_URL") or _redis_url()
    if (reason := _redis_reachable(url)) is not None:
        raise TargetUnavailable(reason)
    database = "budget.db" if name == "serve-budget" else f"{name}.db"
    database_url = f"sqlite:///{environment.workdir / database}"
    env = {**environment.gateway_env(routed=True), "DATABASE_URL": database_url}
    created = create_key(database_url, f"bench-{name}", environment.routes_path)
    for provider, model, _ in ROUTED_TARGETS:
        _cli(["prices", "set", "--provider", provider, "--model", model,
              "--input", BENCH_PRICES[0], "--output", BENCH_PRICES[1]], env)
    _cli(["budgets", "set", "--key", created["prefix"], "--daily-usd", "1000000",
          "--tokens-per-minute", "1000000000"], env)
    namespace = f"llmg-bench-{name}-{os.getpid()}-{int(time.time())}"
    target = start_serve(
        environment, name=name, routed=True, database_url=database_url,
        key=created["key"],
        extra_env={"REDIS_URL": url, "REDIS_NAMESPACE": namespace, **(extra_env or {})},
        notes=[f"Redis {url} (namespace {namespace}): rate limit and budget ledger",
               f"prices {BENCH_PRICES[0]}/{BENCH_PRICES[1]} USD per million tokens; key budget "
               "daily 1 000 000 USD, 1e9 tokens per minute"])
    target.cleanup.append(lambda: _forget_namespace(url, namespace))
    return target


def _sidecar_help_works() -> bool:
    try:
        completed = subprocess.run([LLM_GATEWAY, "sidecar", "--help"], capture_output=True,
                                   text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return completed.returncode == 0 and "--mode" in completed.stdout


def start_sidecar(environment: Environment, mode: str) -> Target:
    if not _sidecar_help_works():
        raise TargetUnavailable("`llm-gateway sidecar --help` does not work in this checkout")
    port, admin_port = free_port(), free_port()
    command = [LLM_GATEWAY, "sidecar", "--listen", f"127.0.0.1:{port}",
               "--admin", f"127.0.0.1:{admin_port}", "--mode", mode]
    ca_bundle: Path | None = None
    if mode == "regular":
        ca_bundle = environment.workdir / "sidecar-ca-bundle.pem"
        command += ["--ca-dir", str(environment.workdir / "sidecar-ca"),
                    "--ca-bundle-out", str(ca_bundle)]
    name = f"sidecar-{mode}"
    env = environment.gateway_env(routed=True)
    process = start_process(name, command, env, environment.workdir, environment.target_cpus)
    _wait_until_answering(process, Endpoint("127.0.0.1", admin_port),
                          RequestSpec("GET", "/readyz", (), b""))
    if mode == "reverse":
        endpoint = Endpoint("127.0.0.1", port)
        api_path = "/v1/chat/completions"
        notes = ["mitmproxy reverse mode, plain HTTP"]
    else:
        endpoint = Endpoint(REGULAR_MODE_HOST, 443, tls=True, proxy=("127.0.0.1", port),
                            ca_file=str(ca_bundle))
        api_path = "/api/v1/chat/completions"
        notes = ["HTTPS_PROXY: CONNECT + TLS interception with the sidecar's CA, HTTP/1.1"]
    notes += [_access_log_note(env), _routing_note(True)]
    return Target(name, endpoint, api_path, f"Bearer {environment.gateway_key}", process,
                  fast_model=ROUTED_MODEL, version=_gateway_version(), notes=notes)


def start_litellm(environment: Environment, venv: Path) -> Target:
    try:
        command = litellm_command(venv)
    except LiteLLMUnavailable as exc:
        raise TargetUnavailable(str(exc)) from None
    port = free_port()
    config, stream_models = write_config(
        environment.workdir / "litellm.yaml", api_base=environment.fake_base_url,
        api_key=FAKE_API_KEY, master_key=LITELLM_MASTER_KEY,
        stream_shapes=environment.stream_shapes,
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL") and not k.lower().endswith("_proxy")}
    env.update({
        # Offline and quiet: no model-cost map or tokenizer download (nothing is reachable,
        # and a blocking retry loop would stall the event loop), no debug logs.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "PYTHONUNBUFFERED": "1",
    })
    process = start_process(
        "litellm",
        [*command, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        env, environment.workdir, environment.target_cpus,
    )
    endpoint = Endpoint("127.0.0.1", port)
    _wait_until_answering(process, endpoint, RequestSpec("GET", "/health/liveliness", (), b""))
    return Target("litellm", endpoint, "/v1/chat/completions", f"Bearer {LITELLM_MASTER_KEY}",
                  process, fast_model="bench-fast", stream_models=stream_models,
                  version=f"litellm[proxy]=={LITELLM_VERSION}",
                  notes=["1 worker, master key auth, no database, LITELLM_LOG=ERROR"])


def start_target(name: str, environment: Environment, litellm_venv: Path) -> Target:
    if name == "direct":
        return direct_target(environment)
    if name == "serve":
        return start_serve(environment, routed=True)
    if name == "serve-legacy":
        return start_serve(environment, name="serve-legacy", routed=False)
    if name == "serve-budget":
        return start_serve_budget(environment)
    if name == "serve-redis":
        return start_serve_redis(environment)
    if name == "sidecar-reverse":
        return start_sidecar(environment, "reverse")
    if name == "sidecar-regular":
        return start_sidecar(environment, "regular")
    if name == "litellm":
        return start_litellm(environment, litellm_venv)
    raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGET_NAMES)}")
