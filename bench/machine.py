"""A description of the machine the figures were measured on, for the JSON and the docs."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def _lscpu_fields() -> dict[str, str]:
    if shutil.which("lscpu") is None:
        return {}
    try:
        output = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=10, check=True,
            env={**os.environ, "LC_ALL": "C"},
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields: dict[str, str] = {}
    for line in output.splitlines():
        name, _, value = line.partition(":")
        if value:
            fields[name.strip()] = value.strip()
    return fields


def _memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _tool_version(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    # wrk prints its version on the first line of its usage text, with a non-zero status.
    text = (completed.stdout or completed.stderr).strip()
    return text.splitlines()[0].strip() if text else None


def describe_machine() -> dict[str, object]:
    lscpu = _lscpu_fields()
    memory = _memory_total_bytes()
    return {
        "cpu_model": lscpu.get("Model name") or platform.processor() or "unknown",
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "threads_per_core": lscpu.get("Thread(s) per core"),
        "hypervisor": lscpu.get("Hypervisor vendor"),
        "memory_gib": round(memory / 2**30, 1) if memory else None,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "wrk": _tool_version(["wrk", "--version"]),
        "hey": "installed" if shutil.which("hey") else None,
    }


def machine_summary(machine: dict[str, object]) -> str:
    """One line for the table header and the docs: model, cores, memory, kernel, Python."""
    return (
        f"{machine['cpu_model']}, {machine['cpus']} CPUs, {machine['memory_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}"
    )
