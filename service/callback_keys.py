"""Which URL and which key a token's callbacks use. ``MERGE_SERVICE_CALLBACK_TOKENS`` maps API tokens to a default
callback URL and a signing secret of their own (``{"<token>": {"url": ..., "secret": ...}}``); a job signs with
its token's secret, else with ``MERGE_SERVICE_CALLBACK_SECRET``. Tokens and secrets are secrets: the setting is
read from a ``SecretStr``, entries are keyed here by the token's fingerprint (as ``Caller.fingerprint`` is), and
errors name an entry by its position, never by its token or secret."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import SecretStr

from service.client.signatures import key_id

if TYPE_CHECKING:
    from service.settings import Settings

ENTRY_FIELDS = frozenset({"url", "secret"})


@dataclass(frozen=True)
class SigningKey:
    """A secret that signs callbacks, with the id receivers see in ``Merge-Service-Key-Id``."""

    id: str
    secret: SecretStr

    @classmethod
    def of(cls, secret: SecretStr) -> SigningKey:
        return cls(id=key_id(secret.get_secret_value()), secret=secret)


@dataclass(frozen=True)
class TokenCallback:
    """One token's callback settings: the URL its jobs call back when their spec names none, and its key."""

    url: str | None
    key: SigningKey | None


def fingerprint(token: str) -> str:
    """The token's fingerprint, as ``service.deps.require_token`` computes it for its caller."""
    return hashlib.sha256(token.encode()).hexdigest()


def _entry(position: int, value: object) -> TokenCallback:
    where = f"callback_tokens: entry {position}"
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object with a url, a secret or both")
    unknown = sorted(set(value) - ENTRY_FIELDS)
    if unknown:
        raise ValueError(f"{where} has unknown fields {unknown} (expected url and secret)")
    url, secret = value.get("url"), value.get("secret")
    if url is None and secret is None:
        raise ValueError(f"{where} names neither a url nor a secret")
    if url is not None and not (isinstance(url, str) and url):
        raise ValueError(f"{where}: url must be a non-empty string")
    if secret is not None and not (isinstance(secret, str) and secret):
        raise ValueError(f"{where}: secret must be a non-empty string")
    return TokenCallback(url=url, key=SigningKey.of(SecretStr(secret)) if secret is not None else None)


def parse_callback_tokens(raw: str, tokens: Iterable[str]) -> dict[str, TokenCallback]:
    """Read the setting's JSON, keyed by fingerprint. Every token must be a configured API or admin token.
    Raises ``ValueError`` naming the entry by position (1 for the first)."""
    try:
        document = json.loads(raw)
    except ValueError as exc:
        # The decoder's message names a position in the text, never the text itself.
        raise ValueError(f"callback_tokens is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError('callback_tokens must be a JSON object: {"<api token>": {"url": ..., "secret": ...}}')
    known = set(tokens)
    entries: dict[str, TokenCallback] = {}
    for position, (token, value) in enumerate(document.items(), start=1):
        if token not in known:
            raise ValueError(
                f"callback_tokens: entry {position} names a token that is in neither api_tokens nor admin_tokens"
            )
        entries[fingerprint(token)] = _entry(position, value)
    return entries


@lru_cache(maxsize=8)
def _token_callbacks(raw: str, tokens: tuple[str, ...]) -> Mapping[str, TokenCallback]:
    return parse_callback_tokens(raw, tokens)


def token_callbacks(settings: Settings) -> Mapping[str, TokenCallback]:
    """The deployment's per-token callbacks by fingerprint (checked at start-up, so parsing here cannot fail)."""
    if settings.callback_tokens is None:
        return {}
    tokens = (*settings.api_tokens, *settings.admin_tokens)
    return _token_callbacks(settings.callback_tokens.get_secret_value(), tokens)


def default_url(settings: Settings, scope: str) -> str | None:
    """The callback URL of a job whose spec names none: its token's, if the deployment gives it one."""
    entry = token_callbacks(settings).get(scope)
    return entry.url if entry is not None else None


@lru_cache(maxsize=8)
def _global_key(secret: SecretStr) -> SigningKey:
    return SigningKey.of(secret)


def signing_key(settings: Settings, scope: str) -> SigningKey | None:
    """The key that signs a job's callbacks: its token's own secret, else the deployment's ``callback_secret``;
    None when neither is set."""
    entry = token_callbacks(settings).get(scope)
    if entry is not None and entry.key is not None:
        return entry.key
    if settings.callback_secret is None:
        return None
    return _global_key(settings.callback_secret)
