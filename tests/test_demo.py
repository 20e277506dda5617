"""`llm-gateway demo` answers /healthz, its printed Python snippet works, the `keys list`
line it prints shows its key, its console answers, and a second demo on the same port
fails before it makes a key; `demo --check` is the installed package's self-test."""

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
    admin_port = free_port()
    env["BIND_ADDR"] = f"127.0.0.1:{port}"
    env["ADMIN_BIND_ADDR"] = f"127.0.0.1:{admin_port}"
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
        # The demo uses its own SQLite file beside the working directory, and says how to
        # list its keys: the line, run as printed, shows the demo key.
        assert (tmp_path / "llm-gateway-demo.db").exists()
        keys_line = re.search(r"^  its keys: +(DATABASE_URL=(\S+) (\S+) keys list)$", output, re.M)
        assert keys_line, output
        listed = subprocess.run(
            [keys_line.group(3), "keys", "list"], capture_output=True, text=True, timeout=30,
            env={**env, "DATABASE_URL": keys_line.group(2)})
        assert listed.returncode == 0 and "demo" in listed.stdout, listed
        console = re.search(r"^  admin console: +(\S+)", output, re.M)
        assert console and console.group(1) == f"http://127.0.0.1:{admin_port}/admin/"
        assert httpx.get(console.group(1)).status_code == 200
        assert re.search(r"^  admin token: +llmga?_\S+$", output, re.M), output
        # A second demo on the same port fails at once, before it makes a key or a banner.
        second = subprocess.run([str(BIN / "llm-gateway"), "demo"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 1 and "gateway key" not in second.stdout
        assert f"cannot listen on 127.0.0.1:{port}" in second.stderr
    finally:
        process.terminate()
        process.wait(10)
    assert sys.executable


def test_demo_check_is_a_self_test_that_leaves_nothing_behind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in {"VENICE_API_KEY", "DATABASE_URL", "VENICE_BASE_URL"}}
    result = subprocess.run([str(BIN / "llm-gateway"), "demo", "--check"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("llm-gateway demo --check: ok (JSON 200, stream 200")
    assert "2 usage records" in result.stdout
    assert list(tmp_path.iterdir()) == []
