"""Structured logs (structlog): JSON lines with job id, target and attempt bound while a job runs.

Records of the standard ``logging`` module (uvicorn's server and access logs, Alembic, libraries) go through the
same processors and renderer, so a deployment reads one format. An access log record carries the request as
fields (``client``, ``method``, ``path``, ``http_version``, ``status``) besides its usual message."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_configured = False
ACCESS_LOGGER = "uvicorn.access"


class _StderrLogger:
    """Writes each rendered line to whatever ``sys.stderr`` is now (it may be replaced after start-up)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg


def _stderr_logger(*_args: object) -> _StderrLogger:
    return _StderrLogger()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever ``sys.stderr`` is when a record is written."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _access_fields(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """uvicorn logs ``'%s - "%s %s HTTP/%s" %d'`` with (client, method, path, http version, status) as args."""
    args = event.pop("positional_args", None)
    record = event.get("_record")
    if record is not None and record.name == ACCESS_LOGGER and isinstance(args, tuple) and len(args) == 5:
        client, method, path, http_version, status = args
        event.update(client=client, method=method, path=path, http_version=http_version, status=status)
    return event


def configure_logging(level: str = "INFO", *, json: bool = True) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                *shared,
                structlog.stdlib.add_logger_name,
                _access_fields,
                structlog.processors.format_exc_info,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            pass_foreign_args=True,
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=True,
    )
