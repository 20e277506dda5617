"""The `llm-gateway` command line as a new user meets it: `--version`, and `--config`
wherever it is written."""

from __future__ import annotations

import argparse
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


def _parsers(parser: argparse.ArgumentParser, path: str = "llm-gateway") -> list[
        tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _parsers(child, f"{path} {name}")
    return found


def test_every_option_says_what_it_is_and_its_default() -> None:
    """`--help` of every command explains each of its arguments, and shows each default
    that is not None or False."""
    missing, silent_defaults = [], []
    for path, parser in _parsers(build_parser()):
        shown = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction
                          | argparse._SubParsersAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {name}")
            elif (action.default not in (None, False, "", argparse.SUPPRESS, [])
                  and action.option_strings and f"default: {action.default}" not in
                  " ".join(shown.split()) and "default" not in action.help):
                silent_defaults.append(f"{path} {name} (default {action.default!r})")
    assert missing == [], "arguments without help: " + ", ".join(missing)
    assert silent_defaults == [], "defaults not shown: " + ", ".join(silent_defaults)
