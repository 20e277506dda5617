"""Acceptance: `llm-gateway demo` answers /healthz and its printed Python snippet works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support import BIN, free_port, wait_until_up


def test_demo_prints_a_snippet_that_gets_a_completion(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in {"VENICE_API_KEY", "DATABASE_URL", "VENICE_BASE_URL"}}
    env["BIND_ADDR"] = f"127.0.0.1:{port}"
    process = subprocess.Popen([str(BIN / "llm-gateway"), "demo"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    snippet_done = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.strip() == "PY":
                snippet_done.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert snippet_done.wait(30), "".join(lines)
        wait_until_up(f"http://127.0.0.1:{port}/healthz", timeout=20)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
        output = "".join(lines)
        match = re.search(r"^(\S+) - <<'PY'\n(.*?)^PY$", output, re.S | re.M)
        assert match, output
        interpreter, code = match.groups()
        assert Path(interpreter).exists()
        started = time.monotonic()
        result = subprocess.run([interpreter, "-"], input=code, capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("This is chunk 0"), result.stdout
        assert time.monotonic() - started < 30
        curl = re.search(r"^curl .*?'$", output, re.S | re.M)
        assert curl and "Authorization: Bearer llmg_" in curl.group(0)
        # The demo uses its own SQLite file beside the working directory.
        assert (tmp_path / "llm-gateway-demo.db").exists()
    finally:
        process.terminate()
        process.wait(10)
    assert sys.executable
