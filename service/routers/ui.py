"""The operations page (``/ui``): what is queued, running and failing per table, and how long merges take.

It authenticates with the API's tokens and shows what the API would show that token. A browser cannot send a
bearer header when it navigates, so the login form keeps the token in an HttpOnly, SameSite=Strict cookie scoped
to ``/ui`` (never in a URL); API clients may send the header instead. The page is read-only but for cancelling,
which the token may do through the API for the same jobs: a form POST checked against cross-site requests by the
cookie's SameSite, the request's Origin and a form token derived from the caller's token."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

import structlog
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from service.deps import Caller, ManagerDep, MetricsDep, SettingsDep, authenticate, unauthorized
from service.errors import InvalidCursorError, JobNotFoundError
from service.jobs import JobRecord, Status
from service.manager import JobManager
from service.problems import cancelled_problem
from service.settings import Settings
from service.store import utcnow
from service.ui_pages import DEFAULT_WINDOW, WINDOWS, Overview, render_login, render_overview

router = APIRouter(prefix="/ui", include_in_schema=False)
log = structlog.get_logger(__name__)

COOKIE = "merge_service_ui"
"""The cookie holding the signed-in token: HttpOnly (no script reads it), SameSite=Strict (no other site's page
sends it), path ``/ui`` (the API never sees it as a credential)."""
CSRF_MESSAGE = b"merge-service operations page: cancel"
FORM_LIMIT = 8192
TABLES_PER_PAGE = 25
FAILURES_PER_PAGE = 10


def _presented_token(request: Request) -> tuple[str | None, bool]:
    """The token the request carries, and whether it came in the page's cookie (else the bearer header)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    cookie = request.cookies.get(COOKIE)
    return (cookie, True) if cookie else (None, False)


def _caller(request: Request, settings: Settings) -> tuple[Caller | None, str, bool]:
    token, from_cookie = _presented_token(request)
    return authenticate(settings, token), token or "", from_cookie


def form_token(token: str) -> str:
    """The cancel forms' anti-forgery token: only a holder of the caller's token can compute it."""
    return hmac.new(token.encode(), CSRF_MESSAGE, hashlib.sha256).hexdigest()


def _same_origin(request: Request) -> bool:
    """Whether a state-changing POST comes from a page of this service: browsers send ``Origin`` with every
    POST (``Referer`` as a fallback); a request with neither is refused."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return False
    return urlsplit(source).netloc == request.headers.get("host", "")


def _security_headers(response: Response, nonce: str | None = None) -> Response:
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    response.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src {script}; connect-src 'self'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _to_login() -> Response:
    return _security_headers(RedirectResponse("/ui/login", status_code=303))


def _who(caller: Caller, settings: Settings) -> str:
    if not settings.api_tokens and not settings.admin_tokens:
        return "No API tokens are configured: every job is shown."
    if caller.sees_all:
        return f"Admin token {caller.fingerprint[:8]}: every token's jobs."
    return f"Token {caller.fingerprint[:8]}: its own jobs."


@router.get("")
def overview_page(
    request: Request,
    settings: SettingsDep,
    manager: ManagerDep,
    window: Annotated[str, Query(max_length=8)] = DEFAULT_WINDOW,
    tables_after: Annotated[str | None, Query(max_length=4096)] = None,
    failures_before: Annotated[str | None, Query(max_length=1024)] = None,
) -> Response:
    caller, token, from_cookie = _caller(request, settings)
    if caller is None:
        return _to_login()
    chosen = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
    owner = caller.owner
    now = utcnow()
    start = chosen.start(now)
    tables, tables_next = manager.table_counts(owner=owner, after=tables_after, limit=TABLES_PER_PAGE)
    try:
        failures, failures_next = manager.failures(owner=owner, before=failures_before, limit=FAILURES_PER_PAGE)
    except InvalidCursorError:
        failures, failures_next = manager.failures(owner=owner, limit=FAILURES_PER_PAGE)
    nonce = secrets.token_urlsafe(16)
    view = Overview(
        who=_who(caller, settings),
        signed_in=from_cookie,
        totals=manager.status_counts(owner=owner),
        tables=tables,
        tables_next=tables_next,
        running=manager.running(owner=owner),
        queued=manager.queued(owner=owner),
        failures=failures,
        failures_next=failures_next,
        window=chosen,
        window_start=start,
        buckets=manager.finished_over_time(since=start, width=chosen.width, buckets=chosen.buckets, owner=owner),
        csrf=form_token(token),
        nonce=nonce,
    )
    return _security_headers(HTMLResponse(render_overview(view)), nonce)


@router.get("/live.json")
def live(request: Request, settings: SettingsDep, manager: ManagerDep) -> Response:
    """What the page refreshes: the counts per status and the running merges' phases."""
    caller, _, _ = _caller(request, settings)
    if caller is None:
        raise unauthorized("Sign in again: the page's token is no longer valid (or a bearer token is required).")
    counts = manager.status_counts(owner=caller.owner)
    running = manager.running(owner=caller.owner)
    body = {
        "counts": {status.value: n for status, n in counts.items()},
        "running": [{"id": j.id, "phase": j.phase.value, "cancel_requested": j.cancel_requested} for j in running],
    }
    return _security_headers(JSONResponse(body))


@router.get("/login")
def login_page(request: Request, settings: SettingsDep) -> Response:
    if not settings.api_tokens and not settings.admin_tokens:
        return _security_headers(RedirectResponse("/ui", status_code=303))
    return _security_headers(HTMLResponse(render_login()))


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if len(body) > FORM_LIMIT:
        return {}
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=8)
    return {name: values[0] for name, values in fields.items() if values}


@router.post("/login")
async def login(request: Request, settings: SettingsDep) -> Response:
    if not settings.api_tokens and not settings.admin_tokens:
        return _security_headers(RedirectResponse("/ui", status_code=303))
    if not _same_origin(request):
        return _security_headers(HTMLResponse(render_login("The sign-in came from another site."), status_code=403))
    token = (await _form(request)).get("token", "").strip()
    if authenticate(settings, token) is None:
        return _security_headers(HTMLResponse(render_login("That token is not valid here."), status_code=401))
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return _security_headers(response)


@router.post("/logout")
async def logout(request: Request) -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    if _same_origin(request):
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return _security_headers(response)


@router.post("/jobs/{id}/cancel")
async def cancel(
    request: Request,
    job_id: Annotated[str, Path(alias="id", max_length=64)],
    settings: SettingsDep,
    manager: ManagerDep,
    metrics: MetricsDep,
) -> Response:
    """Cancel as ``POST /merges/{id}/cancel`` does, for the jobs the caller may cancel there."""
    caller, token, _ = _caller(request, settings)
    if caller is None:
        return _to_login()
    form = await _form(request)
    if not _same_origin(request) or not hmac.compare_digest(form.get("csrf", ""), form_token(token)):
        return _security_headers(HTMLResponse("Refused: the request did not come from this page.", status_code=403))
    try:
        job, ended = await run_in_threadpool(_request_cancel, manager, job_id, caller)
    except JobNotFoundError:
        return _security_headers(HTMLResponse("No job of yours has this id.", status_code=404))
    if ended:
        metrics.jobs_finished.labels(Status.CANCELLED.value).inc()
    log.info("job cancel requested", job_id=job_id, status=job.status.value, via="ui")
    return _security_headers(RedirectResponse("/ui", status_code=303))


def _request_cancel(manager: JobManager, job_id: str, caller: Caller) -> tuple[JobRecord, bool]:
    return manager.request_cancel(
        job_id,
        problem=cancelled_problem("The job was cancelled before it started; the table is unchanged."),
        owner=caller.owner,
    )
