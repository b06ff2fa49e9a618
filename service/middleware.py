"""Around the handlers: the request body limit (413 before any parsing), strict JSON bodies (415 for a body not
sent as JSON, 422 for one that is not JSON), HEAD answered as GET, empty query values as not given, and HTTP
request metrics."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics
from service.problems import problem


class _NotJson(Exception):
    """A value Python's JSON reader takes but JSON (RFC 8259) does not have."""


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"{text} is beyond the range of a JSON number (a 64-bit float)")
    return value


def loads_strict(body: bytes) -> Any:
    """``body`` as RFC 8259 JSON. Python's reader also takes NaN and Infinity (and turns 1e999 into infinity),
    and fails on bad UTF-8, deep nesting and overlong integers with errors FastAPI answers as 400: every
    refusal here is a JSONDecodeError instead, which FastAPI answers as the validation problem (422)."""
    try:
        return json.loads(body, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise json.JSONDecodeError(f"{exc.msg} at line {exc.lineno}, column {exc.colno}", exc.doc, exc.pos) from None
    except _NotJson as exc:
        raise json.JSONDecodeError(str(exc), "", 0) from None
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"the body is not UTF-8 text (byte {exc.start})", "", 0) from None
    except RecursionError:
        raise json.JSONDecodeError("objects and arrays nest too deeply", "", 0) from None
    except ValueError as exc:  # an integer of more digits than Python reads
        reason = "a number has too many digits" if "digits" in str(exc) else str(exc)
        raise json.JSONDecodeError(reason, "", 0) from None


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


def _is_json_media_type(content_type: str) -> bool:
    """``application/json`` or a ``+json`` type, whatever its parameters (``charset``) and case."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is read by ``loads_strict``, and refused with 415 when it is sent as anything but
    JSON: FastAPI would otherwise validate it as text and answer that a dictionary was expected."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict(request: Request) -> Response:
            strict_request = StrictJsonRequest(request.scope, request.receive)
            if takes_body:
                content_type = request.headers.get("content-type")
                if content_type is None:
                    refused = bool(await strict_request.body())  # no body at all: the missing body's 422
                else:
                    refused = not _is_json_media_type(content_type)
                if refused:
                    return _not_json(request, content_type)
            return await handler(strict_request)

        return strict


def _not_json(request: Request, content_type: str | None) -> Response:
    sent = "no Content-Type" if content_type is None else f"Content-Type {content_type!r}"
    return problem(
        status=415,
        instance=request.url.path,
        title="Body is not JSON",
        detail=f"The request body must be JSON sent with Content-Type: application/json; this one has {sent}.",
        type_="urn:merge-service:problem:unsupported-media-type",
        headers={"Accept-Post": "application/json"},
    )


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


class HeadAsGetMiddleware:
    """HEAD answers as GET would, headers and all, without the body (RFC 9110 9.3.2): FastAPI routes a GET
    endpoint for GET only, so ``curl -I`` would otherwise get 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        as_get = {**scope, "method": "GET"}
        try:
            await self.app(as_get, receive, headers_only)
        finally:
            if "route" in as_get:  # for the metrics around: the route template the GET matched
                scope["route"] = as_get["route"]


class EmptyQueryValuesMiddleware:
    """A query parameter with an empty value (``?status=&cursor=``) counts as not given: forms and URL templates
    send every parameter, filled in or not, and a filter left empty means no filter, not an invalid one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"") if scope["type"] == "http" else b""
        if query:
            pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
            given = [(name, value) for name, value in pairs if value != ""]
            if len(given) != len(pairs):
                scope["query_string"] = urlencode(given).encode("latin-1")
        await self.app(scope, receive, send)


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
