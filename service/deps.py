"""Request dependencies as ``Annotated`` aliases: what a handler needs, named once.

They are ``async`` although they never await: FastAPI runs a plain ``def`` dependency in its thread pool, a hop
that costs more than the dependency itself."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.manager import JobManager
from service.metrics import ServiceMetrics
from service.paths import LakeRoots
from service.settings import Settings


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_manager(request: Request) -> JobManager:
    return request.app.state.manager  # type: ignore[no-any-return]


async def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


async def get_roots(request: Request) -> LakeRoots:
    return request.app.state.roots  # type: ignore[no-any-return]


SettingsDep = Annotated[Settings, Depends(get_settings)]
ManagerDep = Annotated[JobManager, Depends(get_manager)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
RootsDep = Annotated[LakeRoots, Depends(get_roots)]

_bearer = HTTPBearer(auto_error=False, description="Required when the deployment configures API tokens.")


@dataclass(frozen=True)
class Caller:
    """Who is calling: the fingerprint of their bearer token ("" when the deployment has no tokens), and
    whether they may see every caller's jobs (an admin token, or no tokens at all: everyone is one caller)."""

    fingerprint: str
    sees_all: bool

    @property
    def owner(self) -> str | None:
        """Whose jobs this caller may read and cancel: its own fingerprint, or None for every job."""
        return None if self.sees_all else self.fingerprint


NO_TOKENS = Caller(fingerprint="", sees_all=True)


def authenticate(settings: Settings, given: str | None) -> Caller | None:
    """The caller a token names, compared in constant time against every configured token (API and admin
    tokens); None when tokens are configured and ``given`` is none of them."""
    if not settings.api_tokens and not settings.admin_tokens:
        return NO_TOKENS
    presented = (given or "").encode()
    matched: bytes | None = None
    admin = False
    for token in settings.api_tokens:
        if hmac.compare_digest(presented, token.encode()):
            matched = token.encode()
    for token in settings.admin_tokens:
        if hmac.compare_digest(presented, token.encode()):
            matched, admin = token.encode(), True
    if given is None or matched is None:
        return None
    return Caller(fingerprint=hashlib.sha256(matched).hexdigest(), sees_all=admin)


async def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """Bearer tokens (see ``authenticate``)."""
    caller = authenticate(settings, credentials.credentials if credentials is not None else None)
    if caller is None:
        raise unauthorized("A valid bearer token is required (Authorization: Bearer <token>).")
    return caller


def unauthorized(detail: str) -> HTTPException:
    """The 401 every refused token gets: a problem document with the challenge RFC 9110 asks of a 401."""
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": 'Bearer realm="merge-service"'})


AuthDep = Annotated[Caller, Depends(require_token)]
"""The caller (see ``require_token``); declaring it makes an endpoint require a token."""
