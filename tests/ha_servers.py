"""Highly available stores of a test's own, on free ports in a temporary directory: a Redis
primary with a replica and a sentinel, a six-node Redis Cluster, a Postgres primary with a
standby made by pg_basebackup. Each is stopped (SIGKILL for Redis, pg_ctl for Postgres) and
its directory removed when the test ends; the machine's shared servers are never touched."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import redis

from tests.support import free_port, need_service


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until ``condition()`` is true; AssertionError naming ``what`` past ``timeout``."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if condition():
                return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"{what} within {timeout}s"
        time.sleep(0.02)


class RedisNodes:
    """redis-server processes of one test, by port."""

    def __init__(self, directory: Path) -> None:
        if not shutil.which("redis-server") or not shutil.which("redis-cli"):
            need_service("redis-server and redis-cli (the binaries)", False)
        self.directory = directory
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, *arguments: str, port: int | None = None, sentinel: bool = False) -> int:
        port = port or free_port()
        home = self.directory / str(port)
        home.mkdir(exist_ok=True)
        if sentinel:  # a sentinel rewrites its configuration file: one of its own
            config = home / "sentinel.conf"
            config.write_text(f"port {port}\nbind 127.0.0.1\ndir {home}\n"
                              + "".join(f"{line}\n" for line in arguments))
            command = ["redis-server", str(config), "--sentinel"]
        else:
            command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--dir", str(home), *arguments]
        self.processes[port] = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)
        wait_for(lambda: redis.Redis(port=port, socket_timeout=1).ping(), 10,
                 f"redis-server on {port} up")
        return port

    def kill(self, port: int) -> None:
        """As a crash is: no goodbye to clients or replicas."""
        process = self.processes.pop(port)
        process.kill()
        process.wait(10)

    def stop_all(self) -> None:
        for port in list(self.processes):
            self.kill(port)


@contextlib.contextmanager
def sentinel_set(directory: Path) -> Iterator[tuple[RedisNodes, int, int, int]]:
    """A primary, its replica and one sentinel watching them as ``svc`` (quorum 1, a
    primary is down after 300 ms of silence): (nodes, primary, replica, sentinel)."""
    nodes = RedisNodes(directory)
    try:
        primary = nodes.start()
        replica = nodes.start("--replicaof", "127.0.0.1", str(primary))
        wait_for(lambda: redis.Redis(port=replica).info("replication")["master_link_status"]
                 == "up", 10, "the replica in sync")
        sentinel = nodes.start(f"sentinel monitor svc 127.0.0.1 {primary} 1",
                               "sentinel down-after-milliseconds svc 300",
                               "sentinel failover-timeout svc 3000", sentinel=True)
        # The sentinel has learnt of the replica (from the primary's INFO) before any
        # failover could need it.
        wait_for(lambda: [r["flags"] for r in redis.Redis(port=sentinel).sentinel_slaves("svc")]
                 == ["slave"], 15, "the sentinel connected to the replica")
        yield nodes, primary, replica, sentinel
    finally:
        nodes.stop_all()


@contextlib.contextmanager
def redis_cluster(directory: Path) -> Iterator[tuple[RedisNodes, list[int]]]:
    """Three primaries and three replicas (``redis-cli --cluster create``), a node failed
    after 500 ms of silence: (nodes, ports)."""
    nodes = RedisNodes(directory)
    try:
        # A replica fails its primary over however long ago it last heard from it
        # (validity factor 0): the test kills a primary seconds after the cluster forms.
        ports = [nodes.start("--cluster-enabled", "yes", "--cluster-node-timeout", "500",
                             "--cluster-replica-validity-factor", "0",
                             "--cluster-config-file", "nodes.conf") for _ in range(6)]
        subprocess.run(["redis-cli", "--cluster", "create",
                        *(f"127.0.0.1:{port}" for port in ports),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        wait_for(lambda: all(redis.Redis(port=port).cluster("info")["cluster_state"] == "ok"
                             for port in ports), 20, "the cluster ok")
        wait_for(lambda: sum(redis.Redis(port=port).info("replication").get(
            "master_link_status") == "up" for port in ports) == 3, 20, "the replicas in sync")
        yield nodes, ports
    finally:
        nodes.stop_all()


def postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        need_service("PostgreSQL's server binaries (/usr/lib/postgresql/*/bin)", False)
    return Path(found[-1]).parent


class PostgresPair:
    """A primary cluster and a standby of it (pg_basebackup -R), as the ``postgres`` user
    when run as root (initdb refuses root), in a directory of their own."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.directory = Path(tempfile.mkdtemp(prefix="llmg-pg-ha-"))
        self.primary_port, self.standby_port = free_port(), free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            record = pwd.getpwnam(self.user)
            os.chown(self.directory, record.pw_uid, record.pw_gid)

    def _run(self, *command: str, timeout: float = 60) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        subprocess.run([*prefix, *command], check=True, capture_output=True, timeout=timeout)

    def data(self, name: str) -> str:
        return str(self.directory / name)

    def start_primary(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", self.data("primary"), "-U", "postgres",
                  "--auth=trust", "--no-sync")
        with open(Path(self.data("primary")) / "postgresql.conf", "a") as conf:
            conf.write("wal_level = replica\nmax_wal_senders = 4\nfsync = off\n")
        self.start("primary", self.primary_port)

    def start(self, name: str, port: int) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", self.data(name), "-w", "-l",
                  self.data(f"{name}.log"), "-o",
                  f"-p {port} -k {self.directory} -c listen_addresses=127.0.0.1", "start")

    def start_standby(self) -> None:
        self._run(str(self.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                  str(self.primary_port), "-U", "postgres", "-D", self.data("standby"), "-R",
                  "-X", "stream")
        self.start("standby", self.standby_port)

    def stop(self, name: str, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", self.data(name), "-m", mode, "-w", "stop")

    def promote(self, name: str) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", self.data(name), "-w", "promote")

    def url(self, port: int) -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def is_primary(self, port: int) -> bool:
        with psycopg.connect(self.url(port), connect_timeout=2) as conn:
            row = conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()
            return bool(row and row[0])

    def close(self) -> None:
        for name in ("primary", "standby"):
            if (Path(self.data(name)) / "postmaster.pid").exists():
                with contextlib.suppress(subprocess.SubprocessError):
                    self.stop(name, "immediate")
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def postgres_pair() -> Iterator[PostgresPair]:
    pair = PostgresPair()
    try:
        pair.start_primary()
        pair.start_standby()
        wait_for(lambda: not pair.is_primary(pair.standby_port), 20, "the standby in recovery")
        yield pair
    finally:
        pair.close()
