"""The real coding agents, installed from npm, and how the tests run them.

``claude`` (``@anthropic-ai/claude-code``) and ``codex`` (``@openai/codex``) are installed once
per machine into a cache directory outside the repository, at the exact versions
:data:`AGENT_PACKAGES` pins (another version means another directory; an install of these
versions is reused, without asking the registry anything). A file lock keeps parallel pytest
workers from installing twice. Without npm or its registry the tests skip ("not reachable"),
unless ``CI`` is set: then they fail.

Each run is headless (``claude -p``, ``codex exec``), with a HOME of its own in the test's
directory, an environment built from nothing (nothing of the machine's leaks in: no key, no
proxy), and a deadline (:data:`AGENT_TIMEOUT`) after which its whole process group is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socketserver
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import need_service

# The versions the tests run, exactly: checked against the wire captures in
# /work/shared/reference/agents-wire.md; move them together with that file.
AGENT_PACKAGES: dict[str, str] = {
    "@anthropic-ai/claude-code": "2.1.332",
    "@openai/codex": "0.171.0",
}
# What each executable says to --version at the pinned version.
_VERSION_LINES = {
    "claude": f"{AGENT_PACKAGES['@anthropic-ai/claude-code']} (Claude Code)",
    "codex": f"codex-cli {AGENT_PACKAGES['@openai/codex']}",
}
AGENT_TIMEOUT = 120.0  # seconds for one agent run, start to exit
_INSTALL_TIMEOUT = 900.0  # two native binaries of ~400 MB each on a slow line
_COMPLETE = ".installed"  # written last: a directory without it is a broken install


@dataclass(frozen=True)
class CodingAgents:
    claude: Path
    codex: Path
    directory: Path


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-gateway-tests" / "agents"


def install_directory() -> Path:
    name = "+".join(f"{package.rsplit('/', 1)[-1]}-{version}"
                    for package, version in sorted(AGENT_PACKAGES.items()))
    return cache_root() / name


def coding_agents() -> CodingAgents:
    """The two executables at the pinned versions, installed now if this machine has no
    install of them yet. Skips (outside CI) or fails (in CI) when npm cannot install them
    because npm or its registry is not reachable."""
    directory = install_directory()
    agents = _agents_in(directory)
    if (directory / _COMPLETE).exists():
        return agents
    directory.parent.mkdir(parents=True, exist_ok=True)
    with (directory.parent / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be installing: wait for it
        if not (directory / _COMPLETE).exists():
            _install(directory)
    return agents


def _agents_in(directory: Path) -> CodingAgents:
    bin_dir = directory / "node_modules" / ".bin"
    return CodingAgents(bin_dir / "claude", bin_dir / "codex", directory)


def _install(directory: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        need_service("npm (the command, to install the coding agents)", False)
        return
    shutil.rmtree(directory, ignore_errors=True)  # what an interrupted install left
    directory.mkdir(parents=True)
    specs = [f"{package}@{version}" for package, version in AGENT_PACKAGES.items()]
    command = [npm, "install", "--prefix", str(directory), "--save-exact", "--no-audit",
               "--no-fund", "--update-notifier=false", "--fetch-retries=1",
               "--fetch-retry-mintimeout=2000", "--fetch-retry-maxtimeout=10000", *specs]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        shutil.rmtree(directory, ignore_errors=True)
        need_service(f"the npm registry (npm install took over {_INSTALL_TIMEOUT:.0f} s)", False)
        return
    if done.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        if not _registry_answers(npm):
            need_service("the npm registry (npm ping failed)", False)
        pytest.fail(f"{' '.join(command)} exited with {done.returncode}:\n"
                    f"{done.stdout}\n{done.stderr}")
    agents = _agents_in(directory)
    claude_package = directory / "node_modules" / "@anthropic-ai" / "claude-code"
    if _version_problem(agents.claude, "claude") is not None and \
            (claude_package / "install.cjs").exists():
        # Its postinstall puts the native binary in place of bin/claude.exe; an npm that
        # skips install scripts (ignore-scripts, allowScripts) leaves the placeholder.
        subprocess.run([shutil.which("node") or "node", "install.cjs"], cwd=claude_package,
                       capture_output=True, timeout=120, check=False)
    for name, executable in (("claude", agents.claude), ("codex", agents.codex)):
        problem = _version_problem(executable, name)
        if problem is not None:
            pytest.fail(f"{name} as installed in {directory}: {problem}")
    (directory / _COMPLETE).write_text(json.dumps(AGENT_PACKAGES, indent=2) + "\n")


def _registry_answers(npm: str) -> bool:
    try:
        return subprocess.run([npm, "ping", "--fetch-retries=0"], capture_output=True,
                              timeout=60, stdin=subprocess.DEVNULL, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _version_problem(executable: Path, name: str) -> str | None:
    if not executable.exists():
        return f"{executable} is missing"
    try:
        with tempfile.TemporaryDirectory() as home:  # whatever it writes at start-up
            done = subprocess.run([str(executable), "--version"], capture_output=True,
                                  text=True, timeout=60, stdin=subprocess.DEVNULL,
                                  env=base_environment(Path(home)), check=False)
    except (OSError, subprocess.TimeoutExpired) as failure:
        return f"{executable} --version: {failure}"
    if _VERSION_LINES[name] not in done.stdout:
        return (f"{executable} --version printed {done.stdout!r} (stderr {done.stderr!r}), "
                f"not {_VERSION_LINES[name]!r}")
    return None


# ---- running them ------------------------------------------------------------------------


def base_environment(home: Path) -> dict[str, str]:
    """What every agent run starts from: a PATH with node (codex's launcher is a node script)
    and the system's tools, a HOME of its own; nothing else of this process's environment."""
    node = shutil.which("node")
    path = [str(Path(node).parent)] if node else []
    path += [p for p in ("/usr/local/bin", "/usr/bin", "/bin") if p not in path]
    return {"PATH": os.pathsep.join(path), "HOME": str(home), "LANG": "C.UTF-8",
            "TERM": "dumb", "NO_COLOR": "1"}


@dataclass
class AgentRun:
    command: list[str]
    environment: dict[str, str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (f"{' '.join(self.command)} exited {self.returncode} after {self.seconds:.1f} s\n"
                f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}")


def run_agent(command: list[str], environment: dict[str, str], cwd: Path,
              timeout: float = AGENT_TIMEOUT) -> AgentRun:
    """Run ``command`` to its end, in a process group of its own; past ``timeout`` the
    group is killed and the test fails with what the agent printed so far."""
    started = time.monotonic()
    process = subprocess.Popen(command, env=environment, cwd=cwd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        run = AgentRun(command, environment, -9, stdout, stderr, time.monotonic() - started)
        pytest.fail(f"the agent did not finish in {timeout:.0f} s:\n{run.describe()}")
    finally:
        # Anything it left behind in its group (none is known to): ours to end.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    return AgentRun(command, environment, process.returncode, stdout, stderr,
                    time.monotonic() - started)


def claude_environment(home: Path, *, base_url: str, key: str) -> dict[str, str]:
    """Claude Code pointed at ``base_url`` with the gateway key as its bearer token, its
    config in ``home``, its non-essential traffic (telemetry, MCP registry, update checks)
    off."""
    config = home / ".claude"
    config.mkdir(parents=True, exist_ok=True)
    return {**base_environment(home), "CLAUDE_CONFIG_DIR": str(config),
            "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_AUTH_TOKEN": key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1"}


CODEX_KEY_VARIABLE = "LLM_GATEWAY_KEY"


def codex_environment(home: Path, *, base_url: str, key: str, model: str) -> dict[str, str]:
    """Codex with ``$CODEX_HOME/config.toml`` naming one model provider, the gateway at
    ``base_url`` (the API root, ``/v1`` included) over the Responses API, its key in
    :data:`CODEX_KEY_VARIABLE`. Curated-plugin sync (git and HTTPS to github.com,
    api.github.com, chatgpt.com) and analytics (OTLP metrics to ab.chatgpt.com) are off:
    they are all the other traffic codex exec 0.171.0 makes."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "gateway"\n'
        "\n"
        "[model_providers.gateway]\n"
        'name = "llm-gateway"\n'
        f'base_url = "{base_url}"\n'
        f'env_key = "{CODEX_KEY_VARIABLE}"\n'
        'wire_api = "responses"\n'
        "\n"
        "[features]\n"
        "plugins = false\n"
        "\n"
        "[analytics]\n"
        "enabled = false\n"
    )
    return {**base_environment(home), "CODEX_HOME": str(codex_home), CODEX_KEY_VARIABLE: key}


# ---- a proxy that lets nothing through ---------------------------------------------------


@dataclass
class RefusingProxy:
    """An HTTP proxy that refuses every request (403) and notes its request line: set as
    an agent's proxy, it shows (and stops) every connection to anything but the gateway."""

    url: str
    seen: list[str] = field(default_factory=list)


@contextlib.contextmanager
def refusing_proxy() -> Iterator[RefusingProxy]:
    seen: list[str] = []

    class Refuse(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline(65536).decode("latin-1").strip()
            while self.rfile.readline(65536) not in (b"\r\n", b"\n", b""):
                pass
            seen.append(line)
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n"
                             b"connection: close\r\n\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Refuse)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="refusing-proxy", daemon=True)
    thread.start()
    try:
        yield RefusingProxy(f"http://127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
