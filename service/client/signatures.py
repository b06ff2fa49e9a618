"""Completion callback signatures (``docs/api.md``, "Completion callbacks"): the service signs each request with
HMAC-SHA256 over ``<timestamp>.<body>`` and sends ``Merge-Service-Signature: t=<unix seconds>,v1=<hex>``;
``verify_callback`` checks one in a single call. The timestamp bounds replays: a captured request is refused once
it is older than the tolerance, and the ``Merge-Service-Delivery`` id lets a receiver drop repeats within it.
``Merge-Service-Key-Id`` names the key that signed (``key_id``: a prefix of its SHA-256, never the key), so a
receiver that holds several secrets, one per API token or across a rotation, checks with the right one."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterable
from typing import Any

from service.client.errors import MergeServiceError

SIGNATURE_HEADER = "Merge-Service-Signature"
DELIVERY_HEADER = "Merge-Service-Delivery"
ATTEMPT_HEADER = "Merge-Service-Attempt"
KEY_ID_HEADER = "Merge-Service-Key-Id"
DEFAULT_TOLERANCE_SECONDS = 300.0


class CallbackSignatureError(MergeServiceError):
    """A callback request whose signature is missing, malformed, wrong or outside the time tolerance."""


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def key_id(secret: str | bytes) -> str:
    """The name of a signing key as ``Merge-Service-Key-Id`` carries it: the first 16 hex digits of the SHA-256
    of the key. It tells keys apart without revealing them."""
    return hashlib.sha256(_key(secret)).hexdigest()[:16]


def _secrets(secret: str | bytes | Iterable[str | bytes], given_key_id: str | None) -> list[str | bytes]:
    """The secrets to try: the one the key id names when it names one of them, else every one."""
    secrets = [secret] if isinstance(secret, str | bytes) else list(secret)
    if given_key_id is None:
        return secrets
    named = [s for s in secrets if hmac.compare_digest(key_id(s), given_key_id.strip())]
    if not named:
        raise CallbackSignatureError(f"{KEY_ID_HEADER}: {given_key_id!r} names none of the secrets given")
    return named


def signature(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """The hex HMAC-SHA256 of ``<timestamp>.<body>``."""
    return hmac.new(_key(secret), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def signature_header(secret: str | bytes, body: bytes, timestamp: int) -> str:
    return f"t={timestamp},v1={signature(secret, body, timestamp)}"


def _parse(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise CallbackSignatureError(f"{SIGNATURE_HEADER}: the timestamp {value!r} is not a number") from None
        elif name == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        raise CallbackSignatureError(f"{SIGNATURE_HEADER}: expected t=<unix seconds>,v1=<hex>, got {header!r}")
    return timestamp, signatures


def verify_callback(
    body: bytes,
    header: str | None,
    secret: str | bytes | Iterable[str | bytes],
    *,
    key_id: str | None = None,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a callback request and answer its JSON body. ``body`` is the request's raw bytes, as received (not
    re-serialised JSON), ``header`` the ``Merge-Service-Signature`` value. ``secret`` may be several secrets:
    ``key_id``, the ``Merge-Service-Key-Id`` value, then picks the one that signed (without it each is tried).
    Raises ``CallbackSignatureError``."""
    if not header:
        raise CallbackSignatureError(f"the request has no {SIGNATURE_HEADER} header")
    timestamp, signatures = _parse(header)
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > tolerance_seconds:
        raise CallbackSignatureError(
            f"{SIGNATURE_HEADER}: signed {abs(age):.0f} s {'ago' if age > 0 else 'ahead'}, outside the tolerance of "
            f"{tolerance_seconds:.0f} s"
        )
    expected = [signature(s, body, timestamp) for s in _secrets(secret, key_id)]
    if not any(hmac.compare_digest(e, given) for e in expected for given in signatures):
        raise CallbackSignatureError(f"{SIGNATURE_HEADER}: the signature does not match the body and the secret")
    try:
        document: dict[str, Any] = json.loads(body)
    except ValueError as exc:
        raise CallbackSignatureError(f"the signed body is not JSON: {exc}") from exc
    return document
