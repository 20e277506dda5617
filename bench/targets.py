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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.client import Endpoint, RequestSpec, wait_for_http
from bench.litellm_env import LITELLM_VERSION, LiteLLMUnavailable, litellm_command, write_config

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

TARGET_NAMES = ("direct", "serve", "sidecar-reverse", "sidecar-regular", "litellm")
GATEWAY_TARGETS = TARGET_NAMES[1:]
# The model name sent in requests; LiteLLM maps its own aliases (see litellm_env).
FAST_MODEL = "llama-3.3-70b"


class TargetUnavailable(Exception):
    """The target cannot run here; the run reports why and goes on with the others."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pin_to(cpus: Sequence[int] | None):  # type: ignore[no-untyped-def]
    if not cpus:
        return None
    chosen = set(cpus)

    def pin() -> None:
        os.sched_setaffinity(0, chosen)

    return pin


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
            preexec_fn=_pin_to(cpus), start_new_session=True,
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
            # The fake upstream reads these; the gateways forward unknown headers untouched.
            headers += [("x-fake-chunks", str(chunks)), ("x-fake-chunk-delay-ms", str(delay_ms))]
        body = json.dumps(payload, separators=(",", ":")).encode()
        return RequestSpec("POST", self.api_path, tuple(headers), body)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


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

    @property
    def fake_base_url(self) -> str:
        return f"http://127.0.0.1:{self.fake_port}{FAKE_API_ROOT}"

    def gateway_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.endswith("_PROXY")
               and not k.endswith("_proxy")}
        env.update({
            "DATABASE_URL": self.database_url,
            "VENICE_API_KEY": FAKE_API_KEY,
            "VENICE_BASE_URL": self.fake_base_url,
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("REDIS_URL", None)  # the embedded default: in-process limits
        env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        return env


def start_environment(
    workdir: Path, *, target_cpus: list[int] | None, load_cpus: list[int] | None,
    stream_shapes: list[tuple[int, int]],
) -> Environment:
    """Start the fake upstream (on the load CPUs) and create a gateway key."""
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
    created = subprocess.run(
        [LLM_GATEWAY, "keys", "create", "--name", "bench", "--rate-limit", "100000000/60",
         "--json"],
        env={**os.environ, "DATABASE_URL": database_url}, capture_output=True, text=True,
        check=False, timeout=60,
    )
    if created.returncode != 0:
        fake.stop()
        raise RuntimeError(f"`llm-gateway keys create` failed: {created.stderr[-400:]}")
    key = json.loads(created.stdout.strip().splitlines()[-1])["key"]
    return Environment(workdir, fake_port, fake, key, database_url, target_cpus, load_cpus,
                       stream_shapes)


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


def start_serve(environment: Environment) -> Target:
    port = free_port()
    env = {**environment.gateway_env(), "BIND_ADDR": f"127.0.0.1:{port}"}
    process = start_process("serve", [LLM_GATEWAY, "serve"], env, environment.workdir,
                            environment.target_cpus)
    endpoint = Endpoint("127.0.0.1", port)
    _wait_until_answering(process, endpoint, RequestSpec("GET", "/healthz", (), b""))
    return Target("serve", endpoint, "/v1/chat/completions",
                  f"Bearer {environment.gateway_key}", process, version=_gateway_version(),
                  notes=["1 process (uvicorn, no access log)"])


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
    process = start_process(name, command, environment.gateway_env(), environment.workdir,
                            environment.target_cpus)
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
    return Target(name, endpoint, api_path, f"Bearer {environment.gateway_key}", process,
                  version=_gateway_version(), notes=notes)


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
        return start_serve(environment)
    if name == "sidecar-reverse":
        return start_sidecar(environment, "reverse")
    if name == "sidecar-regular":
        return start_sidecar(environment, "regular")
    if name == "litellm":
        return start_litellm(environment, litellm_venv)
    raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGET_NAMES)}")
