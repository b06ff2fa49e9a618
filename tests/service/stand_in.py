"""What the Worker asks of a runner besides ``run``: for the stand-in runners of the worker tests, the process
tests' ledger worker and the API bench, which run no Spark (nothing to interrupt or close, always ready), and for
the tests' wrappers around the real runner, which change only ``run``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the stand-ins run without the engine; only the wrappers hold one
    from service.runner import EngineRunner


class StandInRunner:
    """The runner protocol's housekeeping for a runner that holds no Spark session."""

    def interrupt(self, tag: str) -> None:
        pass

    def readiness(self) -> tuple[bool, str]:
        return True, "ok"

    def close(self) -> None:
        pass


class WrappedRunner:
    """Around the real runner: interrupts, readiness and closing go to ``inner``; a subclass changes ``run``."""

    def __init__(self, inner: EngineRunner) -> None:
        self.inner = inner

    def interrupt(self, tag: str) -> None:
        self.inner.interrupt(tag)

    def readiness(self) -> tuple[bool, str]:
        return self.inner.readiness()

    def close(self) -> None:
        self.inner.close()
