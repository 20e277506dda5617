"""LiteLLM's proxy, the reference users compare with: its own virtual environment and config.

LiteLLM is never a dependency of the project. The harness installs a pinned release into
``bench/.litellm-venv`` (git-ignored) with the project's Python, the first time it is needed.

Why 1.108.7: the newest release whose ``[proxy]`` extra resolves from PyPI today (1.108.8 to
1.110.2 pin ``litellm-proxy``/``litellm-proxy-extras``/``litellm-enterprise`` versions that are
not published). Releases known to have been compromised on the registry are refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LITELLM_VERSION = os.environ.get("BENCH_LITELLM_VERSION", "1.108.7")
# Published with malicious code (1.82.7, 1.82.8); 1.107.x is reported compromised too and
# is no longer listed on PyPI. Never install these, whatever is asked.
REFUSED_VERSIONS = frozenset({"1.82.7", "1.82.8"})
REFUSED_SERIES = ("1.107.",)

DEFAULT_VENV = Path(__file__).resolve().parent / ".litellm-venv"
INSTALL_TIMEOUT_SECONDS = 900


class LiteLLMUnavailable(Exception):
    pass


def _refused(version: str) -> bool:
    return version in REFUSED_VERSIONS or version.startswith(REFUSED_SERIES)


def installed_version(venv: Path) -> str | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    completed = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if completed.returncode != 0:
        return None
    return completed.stdout.strip() or None


def ensure_litellm(venv: Path = DEFAULT_VENV, version: str = LITELLM_VERSION) -> str:
    """Create the venv and install ``litellm[proxy]==version`` unless it is there already."""
    if _refused(version):
        raise LiteLLMUnavailable(f"litellm {version} is a compromised release; refusing it")
    if installed_version(venv) == version:
        return version
    python = venv / "bin" / "python"
    if not python.exists():
        # The project's interpreter: the same Python version for every target.
        created = subprocess.run([sys.executable, "-m", "venv", str(venv)],
                                 capture_output=True, text=True, check=False, timeout=300)
        if created.returncode != 0:
            raise LiteLLMUnavailable(f"could not create {venv}: {created.stderr[-300:]}")
    print(f"bench: installing litellm[proxy]=={version} into {venv} (once) ...",
          file=sys.stderr, flush=True)
    try:
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             f"litellm[proxy]=={version}"],
            capture_output=True, text=True, check=False, timeout=INSTALL_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        raise LiteLLMUnavailable(f"pip install litellm[proxy]=={version} timed out") from None
    if installed.returncode != 0:
        errors = [line for line in installed.stderr.splitlines()
                  if line.startswith("ERROR") or "rror" in line]
        raise LiteLLMUnavailable(
            f"pip install litellm[proxy]=={version} failed: {' '.join(errors)[-300:]}"
        )
    found = installed_version(venv)
    if found != version:
        raise LiteLLMUnavailable(f"expected litellm {version} in {venv}, found {found}")
    return version


def litellm_command(venv: Path) -> list[str]:
    executable = venv / "bin" / "litellm"
    if not executable.exists():
        raise LiteLLMUnavailable(f"{executable} is missing")
    return [str(executable)]


def stream_model_name(shape: tuple[int, int]) -> str:
    chunks, delay_ms = shape
    return f"bench-stream-{chunks}x{delay_ms}ms"


def write_config(
    path: Path, *, api_base: str, api_key: str, master_key: str,
    stream_shapes: list[tuple[int, int]],
) -> tuple[Path, dict[tuple[int, int], str]]:
    """A proxy config: one alias for fast calls, one per stream shape; master key on.

    LiteLLM drops request headers it does not know, so each stream shape is an alias whose
    ``extra_headers`` tell the fake upstream how to stream. The upstream model name is not
    a Llama one on purpose: for Llama names LiteLLM fetches a tokenizer from the Hugging Face
    hub to count stream tokens, a blocking call that stalls its event loop when offline.
    """
    def model(alias: str, extra_headers: dict[str, str] | None = None) -> str:
        lines = [
            f"  - model_name: {alias}",
            "    litellm_params:",
            "      model: openai/bench-upstream-model",
            f"      api_base: {api_base}",
            f"      api_key: {api_key}",
        ]
        if extra_headers:
            lines.append("      extra_headers:")
            lines += [f'        {name}: "{value}"' for name, value in extra_headers.items()]
        return "\n".join(lines)

    stream_models = {shape: stream_model_name(shape) for shape in stream_shapes}
    models = [model("bench-fast")] + [
        model(name, {"x-fake-chunks": str(shape[0]), "x-fake-chunk-delay-ms": str(shape[1])})
        for shape, name in stream_models.items()
    ]
    text = "\n".join([
        "model_list:", *models,
        "litellm_settings:",
        "  telemetry: false",
        "general_settings:",
        f"  master_key: {master_key}",
        "",
    ])
    path.write_text(text)
    return path, stream_models
