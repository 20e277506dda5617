"""The package stays navigable: small modules and functions, unless a module says at the
top why its size is the concept (a table, a state machine)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.support import REPO

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
EXCEPTION_MARK = "size is the concept"


def oversized() -> list[str]:
    found = []
    for path in sorted((REPO / "llm_gateway").rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        if EXCEPTION_MARK in (ast.get_docstring(tree) or ""):
            continue
        name = path.relative_to(REPO)
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_is_oversized() -> None:
    assert oversized() == []


def test_a_gateway_imports_no_library_its_settings_do_not_use(tmp_path) -> None:
    """redis-py, PyJWT, cryptography and httpx cost a process ~22 MiB together: a gateway
    without REDIS_URL, JWT callers or sealed provider keys never imports them. Nor does a
    sidecar module that may run in reverse mode import mitmproxy (~55 MiB), nor the
    upstream client aiohttp (now the tests' only)."""
    script = (
        "import sys\n"
        "from llm_gateway.config import load_settings\n"
        "from llm_gateway.wiring import build_gateway\n"
        "import llm_gateway.adapters.server, llm_gateway.adapters.sidecar, llm_gateway.cli.run\n"
        f"build_gateway(load_settings({{'DATABASE_URL': 'sqlite:///{tmp_path / 'g.db'}',"
        " 'VENICE_API_KEY': 'sk-test'}))\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules}"
        " & {'redis', 'jwt', 'cryptography', 'httpx', 'psycopg', 'mitmproxy', 'aiohttp'})))\n"
    )
    found = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                           text=True, timeout=60, check=True)
    assert found.stdout.strip() == ""
