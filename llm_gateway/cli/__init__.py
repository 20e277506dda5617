"""The `llm-gateway` command. Each module of this package adds its own subcommands
(``register``); this one assembles them and runs the one asked for."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llm_gateway.cli import admin, billing, demo, keys, providers, reconcile, routes, run, usage
from llm_gateway.cli.common import config_failure, settings_from
from llm_gateway.config import ConfigError
from llm_gateway.telemetry.logs import configure_logging
from llm_gateway.version import VERSION

# In the order `--help` lists them.
COMMAND_GROUPS = (run, demo, keys, admin, billing, usage, reconcile, providers, routes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-gateway", description="An OpenAI-compatible LLM gateway.",
        formatter_class=ShowDefaults,
    )
    parser.add_argument("--config", metavar="FILE",
                        help="YAML settings file (or LLM_GATEWAY_CONFIG); the environment wins")
    parser.add_argument("--version", action="version", version=f"llm-gateway {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(commands)
    _finish_commands(commands)
    return parser


class ShowDefaults(argparse.HelpFormatter):
    """Each option's help ends with its default, where it has one worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.default not in (None, False, "", [], argparse.SUPPRESS)
                and "default" not in text and action.option_strings):
            text += " (default: %(default)s)"
        return text


def _finish_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Every command's help shows defaults, and takes ``--config`` after the subcommand
    too (``serve --config FILE``), as users write it; SUPPRESS: where it is not given
    there, the value before the subcommand stands."""
    for command in set(commands.choices.values()):
        command.formatter_class = ShowDefaults
        command.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                             help="YAML settings file (as before the subcommand)")
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _finish_commands(action)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        configure_logging(settings_from(args).log_format)
        if getattr(args, "passthrough", False):
            return args.handler(args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.handler(args)
    except ConfigError as exc:
        return config_failure(exc)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
