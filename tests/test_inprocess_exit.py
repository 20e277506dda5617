"""The in-process gateway at interpreter exit: an application that made its calls through
``openai_client()`` and simply ends closes the engine cleanly, says nothing about it, and
loses nothing the close writes (the key's last use, flushed only then)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, create_key

pytestmark = pytest.mark.slow_once

# An application: one call through the process's engine, then the end of the program.
APP = """
from llm_gateway.httpx import openai_client
client = openai_client({key!r}, max_retries=0)
answer = client.chat.completions.create(
    model="llama-3.3-70b", messages=[{{"role": "user", "content": "Hello"}}])
print("answered", bool(answer.choices[0].message.content))
"""


def test_an_app_that_ends_closes_the_engine_quietly_and_keeps_its_writes(
        tmp_path: Path, fake_url: str) -> None:
    database_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    record, key = create_key(database_url)
    env = {**os.environ, "DATABASE_URL": database_url, "VENICE_API_KEY": "sk-fake-upstream",
           "VENICE_BASE_URL": fake_url, "USAGE_SPOOL_DIR": str(tmp_path / "spool"),
           "ACCESS_LOG": "off", "REDIS_URL": "", "LLM_GATEWAY_CONFIG": ""}
    done = subprocess.run([sys.executable, "-c", APP.format(key=key)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "answered True"
    # Before: "closing the in-process gateway failed: RuntimeError" (the store's thread
    # pool had been shut down by then, and the last writes were lost with it).
    assert "failed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        (last_used,) = db.execute("SELECT last_used_at FROM gateway_keys WHERE id = ?",
                                  (record.id,)).fetchone()
    assert last_used is not None  # the key's touch, written by the engine's close
