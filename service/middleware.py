"""ASGI middleware: the request body limit (413 before any parsing) and HTTP request metrics."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics
from service.problems import problem


class BodyLimitMiddleware:
    """Refuse bodies over ``limit`` bytes with 413: by Content-Length up front, or while reading a chunked body."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit:
                    await self._too_large(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            status=413,
            instance=scope.get("path"),
            title="Request body too large",
            detail=f"The request body is larger than the limit of {self.limit} bytes.",
            type_="urn:merge-service:problem:body-too-large",
        )
        await response(scope, receive, send)


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    @staticmethod
    def _route(scope: Scope) -> str:
        """The route template (``/merges/{id}``), so label values stay few whatever ids are requested."""
        route: Any = scope.get("route")
        path = getattr(route, "path", None)
        return str(path) if path else "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = self._route(scope)
            method = scope["method"]
            self.metrics.http_requests.labels(method, route, str(status)).inc()
            self.metrics.http_request_seconds.labels(method, route).observe(time.perf_counter() - start)
