"""The chaos soak's private servers, in one temporary directory on free ports: a
redis-server (append-only file on, as a Redis holding budget counters must run: without
it a restart forgets what was spent), a PostgreSQL cluster (initdb and pg_ctl, as the
``postgres`` user when run as root), the faulty fake upstream, and `serve --workers 2`.
The machine's shared Postgres and Redis are never touched."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.procstat import process_tree

BIN = Path(sys.executable).parent
# This checkout's gateway, whatever the environment's editable install points at.
CHECKOUT = Path(__file__).resolve().parents[1]


def _this_checkout(env: dict[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(CHECKOUT), env.get("PYTHONPATH", "")]))}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


class PrivateRedis:
    def __init__(self, directory: Path) -> None:
        if shutil.which("redis-server") is None:
            raise SystemExit("the chaos soak needs redis-server (the binary)")
        self.directory = directory / "redis"
        self.directory.mkdir()
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _listening(self.port), 20, "redis-server up")

    def kill(self) -> None:
        """SIGKILL, as a crash: no goodbye to its clients."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


class PrivatePostgres:
    def __init__(self, directory: Path) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            raise SystemExit("the chaos soak needs PostgreSQL's server binaries "
                             "(/usr/lib/postgresql/*/bin)")
        self.bin = Path(found[-1]).parent
        self.directory = directory / "postgres"
        self.directory.mkdir()
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:  # initdb refuses root
            record = pwd.getpwnam(self.user)
            os.chown(self.directory, record.pw_uid, record.pw_gid)
            directory.chmod(0o711)  # mkdtemp's 0700 would keep that user out

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(command[0]).name} {command[-1]}: {done.stderr[-600:]}")

    def _pg_ctl(self, *arguments: str) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-w",
                  *arguments)

    def init(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.directory / "data"), "-U",
                  "postgres", "--auth=trust", "--no-sync")
        self.start()

    def start(self) -> None:
        self._pg_ctl("-l", str(self.directory / "postgres.log"), "-o",
                     f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
                     "-c max_connections=200", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")


class Gateway:
    """`llm-gateway serve --workers 2`, its output in a file (a pipe nobody reads fills)."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = _this_checkout({**os.environ, **env, "BIND_ADDR": f"127.0.0.1:{self.port}"})
        self.log = directory / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    def cli(self, *arguments: str) -> str:
        """An `llm-gateway` command on the same stores; its stdout."""
        done = subprocess.run([str(BIN / "llm-gateway"), *arguments], env=self.env,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"llm-gateway {' '.join(arguments)}: {done.stderr[-600:]}")
        return done.stdout

    def start(self) -> None:
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [str(BIN / "llm-gateway"), "serve", "--workers", "2"], env=self.env,
                stdout=sink, stderr=subprocess.STDOUT)
        wait_for(lambda: len(self.workers()) == 2 and _listening(self.port), 60,
                 "serve --workers 2 up")

    def workers(self) -> list[int]:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"serve exited with {self.process.returncode}")
        return sorted(process_tree(self.process.pid)[1:])

    def stop(self) -> int:
        """SIGTERM (a clean shutdown flushes the records), SIGKILL after 30 s."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


def faulty_upstream(seed: int) -> tuple[subprocess.Popen[bytes], str]:
    """bench.chaos_upstream in a process of its own; (process, base URL)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bench.chaos_upstream", "--port",
                                str(port), "--seed", str(seed)],
                               env=_this_checkout(dict(os.environ)))
    wait_for(lambda: _listening(port), 30, "the fake upstream up")
    return process, f"http://127.0.0.1:{port}/api/v1"
