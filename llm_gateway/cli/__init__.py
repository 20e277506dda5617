"""The `llm-gateway` command. Each module of this package adds its own subcommands
(``register``); this one assembles them and runs the one asked for."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from llm_gateway.cli import keys, run
from llm_gateway.cli.common import EXIT_CONFIG
from llm_gateway.config import ConfigError

# In the order `--help` lists them.
COMMAND_GROUPS = (run, keys)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-gateway", description="An OpenAI-compatible LLM gateway."
    )
    parser.add_argument("--config", metavar="FILE",
                        help="YAML settings file (or LLM_GATEWAY_CONFIG); the environment wins")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if getattr(args, "passthrough", False):
            return args.handler(args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return args.handler(args)
    except ConfigError as exc:
        print(f"llm-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
