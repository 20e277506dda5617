"""The `llm-gateway` command line as a new user meets it: `--version`, and `--config`
wherever it is written."""

from __future__ import annotations

import subprocess
from pathlib import Path

from llm_gateway.cli import build_parser
from llm_gateway.cli.common import settings_from
from llm_gateway.version import VERSION
from tests.support import BIN


def test_version_is_the_one_version() -> None:
    result = subprocess.run([str(BIN / "llm-gateway"), "--version"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == f"llm-gateway {VERSION}"


def test_config_is_read_before_or_after_the_subcommand(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("bind_addr: 127.0.0.1:3999\n")
    parser = build_parser()
    for argv in (["--config", str(config), "serve"], ["serve", "--config", str(config)],
                 ["keys", "list", "--config", str(config)]):
        assert settings_from(parser.parse_args(argv)).bind_port == 3999, argv
    # Not given after the subcommand: the one before it stands.
    assert parser.parse_args(["--config", str(config), "keys", "list"]).config == str(config)
