"""`serve` or the reverse sidecar as a real process, for the tests that throw hostile
input at both."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support import BIN, free_port, stop_process, wait_until_up

KINDS = ("serve", "sidecar")


@contextlib.contextmanager
def gateway_kind(kind: str, tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """(base URL of the API root, pid) of a `serve` or reverse-sidecar process."""
    port, admin = free_port(), free_port()
    full_env = {**os.environ, "BIND_ADDR": f"127.0.0.1:{port}", "ADMIN_BIND_ADDR": "off",
                "USAGE_SPOOL_DIR": str(tmp_path / f"spool-{kind}"), **env}
    if kind == "serve":
        command = [str(BIN / "llm-gateway"), "serve"]
        ready = f"http://127.0.0.1:{port}/healthz"
    else:
        command = [str(BIN / "llm-gateway"), "sidecar", "--mode", "reverse",
                   "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
                   "--ca-dir", str(tmp_path / "ca")]
        ready = f"http://127.0.0.1:{admin}/healthz"
    process = subprocess.Popen(command, env=full_env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_until_up(ready, process)  # type: ignore[arg-type]
        yield f"http://127.0.0.1:{port}/v1", process.pid
    finally:
        stop_process(process)
