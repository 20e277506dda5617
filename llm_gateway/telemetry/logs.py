"""The process's own log lines, as text or (``LOG_FORMAT=json``) one JSON object each.

Every line goes through the root logger's one handler: the gateway's, uvicorn's (its
servers are built with ``log_config=None``, so its loggers keep no handlers of their own
and propagate here), mitmproxy's (standard ``logging`` loggers too), Python's warnings
and, with JSON, an exception nothing caught. So with ``LOG_FORMAT=json`` every line on
stderr parses as JSON (the access log's lines are JSON already).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from types import TracebackType


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(log_format: str) -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
        # A traceback printed by the interpreter would be the one multi-line text block in
        # a JSON stream: log it instead (a KeyboardInterrupt is left to Python).
        sys.excepthook = _log_uncaught
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    # warnings.warn() writes to stderr itself unless logging takes its warnings.
    logging.captureWarnings(True)


def _log_uncaught(kind: type[BaseException], value: BaseException,
                  traceback: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, traceback)
        return
    logging.getLogger("llm_gateway").critical("uncaught exception",
                                              exc_info=(kind, value, traceback))
