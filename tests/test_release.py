"""What is shipped: the lock covers what pyproject asks for (hashed), the wheel carries
every file of the package, the SBOM is valid CycloneDX, the changelog has this version."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from llm_gateway.version import VERSION

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow_once


def locked(path: Path) -> dict[str, str]:
    """name -> version of a pip-format lock, each pin followed by its hashes."""
    text = path.read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", text, re.M))
    assert pins and text.count("--hash=sha256:") >= len(pins), "every pin needs its hashes"
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins.items()}


def test_the_locks_pin_every_requirement_of_pyproject_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]

    def wanted(extras: list[str]) -> list[Requirement]:
        """The requirements of ``extras``, self-references (llm-gateway[all]) expanded."""
        out = []
        for extra in extras:
            for requirement in map(Requirement, optional[extra]):
                if requirement.name == project["name"]:
                    out += wanted(sorted(requirement.extras))
                else:
                    out.append(requirement)
        return out

    for lock, extras in (("runtime.lock", []), ("all.lock", ["all"]),
                         ("test.lock", ["test", "docs"])):
        pins = locked(ROOT / "requirements" / lock)
        for requirement in [*map(Requirement, project["dependencies"]), *wanted(extras)]:
            name = re.sub(r"[-_.]+", "-", requirement.name).lower()
            assert name in pins, f"{lock} lacks {name}: run `make lock`"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"{lock} pins {name}=={pins[name]}, outside {requirement.specifier}: `make lock`")


def test_the_wheel_carries_every_file_of_the_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=120)
    wheel = next(tmp_path.glob("llm_gateway-*.whl"))
    shipped = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "llm_gateway", "asgi_middleware"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    missing = [path for path in tracked if path not in shipped]
    assert missing == [], f"not in the wheel (package data in pyproject?): {missing}"
    assert f"llm_gateway-{VERSION}.dist-info/METADATA" in shipped


def test_the_sbom_is_valid_cyclonedx_of_the_locked_runtime(tmp_path: Path) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    out = tmp_path / "sbom.cdx.json"
    subprocess.run([str(Path(sys.executable).parent / "cyclonedx-py"), "requirements",
                    str(ROOT / "requirements" / "all.lock"), "--of", "JSON",
                    "--output-reproducible", "-o", str(out)],
                   check=True, capture_output=True, timeout=120)
    document = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(document) is None
    components = json.loads(document)["components"]
    assert {c["name"].lower() for c in components} >= {"httpx", "mitmproxy", "psycopg"}
    # Each a pinned package URL (the lock's hashes ride in its description).
    assert all(re.fullmatch(r"pkg:pypi/[^@]+@[^@]+", c["purl"]) for c in components)


def test_the_changelog_has_this_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog")
    assert re.search(rf"^## \[{re.escape(VERSION)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
