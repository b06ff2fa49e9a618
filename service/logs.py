"""Structured logs (structlog): JSON lines with job id, target and attempt bound while a job runs."""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


class _StderrLogger:
    """Writes each rendered line to whatever ``sys.stderr`` is now (it may be replaced after start-up)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg


def _stderr_logger(*_args: object) -> _StderrLogger:
    return _StderrLogger()


def configure_logging(level: str = "INFO", *, json: bool = True) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=True,
    )
