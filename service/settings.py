"""Configuration from ``MERGE_SERVICE_*`` environment variables (the contract's table, plus operating knobs)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[list[str], NoDecode]


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Everything a deployment can change. Defaults are the embedded, single-machine setup."""

    # Errors name the setting and what is wrong, never the value: tokens, secrets and database passwords are values.
    model_config = SettingsConfigDict(env_prefix="MERGE_SERVICE_", extra="ignore", hide_input_in_errors=True)

    database_url: str = "sqlite:///./var/merge-service.db"
    spark_remote: str = "local"
    lake_roots: CommaList = Field(default_factory=lambda: ["./var/lake"])
    api_tokens: CommaList = Field(default_factory=list)
    """Bearer tokens, comma-separated; empty (with no admin tokens) means no authentication. Each token is a
    tenant: it lists, reads and cancels only the jobs it submitted, and another token's job answers 404."""
    admin_tokens: CommaList = Field(default_factory=list)
    """Bearer tokens (``MERGE_SERVICE_ADMIN_TOKENS``, comma-separated) that may also list, read and cancel every
    token's jobs, as operators need to. They authenticate like API tokens; jobs they submit are their own."""
    workers: int = Field(default=1, ge=0)
    api_processes: int | None = Field(default=None, ge=1)
    """API server processes sharing the port. Unset: one for ``serve`` (API and workers in one process) and for a
    SQLite job table, else one per CPU, at most 4, for ``api``. One process serves requests on one core."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
    backoff_base_seconds: float = Field(default=1.0, ge=0)
    backoff_max_seconds: float = Field(default=60.0, ge=0)
    poll_interval_seconds: float = Field(default=0.2, gt=0)
    default_engine: Literal["builtin", "delta"] = "builtin"
    """The engine of a job whose body names none: the service's own (``builtin``) or Delta's own MERGE INTO
    (``delta``, which needs Delta on the Spark Connect cluster)."""
    app_id: str = "merge-service"
    """The Delta ``txn`` application id of this deployment: with a job's ``seq`` it makes commits exactly-once."""
    log_level: str = "INFO"
    log_json: bool = True
    access_log: bool = True
    """One log line per HTTP request (uvicorn's access log, rendered like every other line)."""
    host: str = "127.0.0.1"
    """The address ``merge-service serve``, ``api`` and ``worker`` listen on (``--host`` overrides it)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """The API's port for ``serve`` and ``api`` (``--port`` overrides it)."""
    worker_port: int = 8001
    """Where ``merge-service worker`` serves /healthz, /readyz and /metrics."""
    list_limit_max: int = 200

    # --- Spark failures: fail fast and recover -------------------------------------------------------------
    spark_max_retries: int = Field(default=5, ge=0)
    """Retries of one Spark Connect call while the server does not answer (gRPC UNAVAILABLE), waiting 0.1 s
    and doubling up to ``spark_max_backoff_seconds``: with the defaults a call to a dead server fails within
    about 3 s (pyspark's own policy waits some 10 minutes). A job whose attempt fails so is retried with the
    job backoff, on a new session."""
    spark_max_backoff_seconds: float = Field(default=2.0, gt=0)
    spark_probe_interval_seconds: float = Field(default=1.0, gt=0)
    """How often each worker's readiness probe asks Spark (``SELECT 1``); /readyz answers from its last answer
    and never waits on Spark."""
    spark_probe_timeout_seconds: float = Field(default=3.0, gt=0)
    """A probe that has not answered within this time makes /readyz answer 503."""
    spark_stall_seconds: float = Field(default=60.0, gt=0)
    """A Spark Connect server that accepts connections but has not answered for this long (a stopped JVM, a
    frozen host) costs the running attempt, which is retried later, instead of holding the worker: gRPC calls
    have no deadline of their own. Long merges are not affected: the readiness probe's small calls measure it."""
    readiness_timeout_seconds: float = Field(default=2.0, gt=0)
    """How long /readyz waits for the job database's answer before it answers 503."""
    warm_up: bool = True
    """Before it claims its first job a worker runs a throwaway merge on scratch tables of its own
    (``engine.warm_up``), so that the first caller's merge is not the cold one; its readiness says "warming up"
    meanwhile."""
    warm_up_seconds: float = Field(default=60.0, ge=0)
    """After its first merges the warm-up goes on with rounds of small merges while one of the last sixteen set a clear
    new best (the server's JIT compiling Spark's hot paths), starting none after this long; 0: the first merges
    only. A server already warm stops them after some twenty rounds, ten seconds or so."""
    warm_up_dir: str | None = None
    """Where the warm-up's scratch tables go (removed afterwards); a directory the Spark server can write to.
    Unset: ``_merge_service_warm_up`` under the first lake root, which Spark and Delta readers skip (a name that
    starts with ``_``)."""

    # --- completion callbacks (``service.callback_delivery``) ------------------------------------------------
    callback_secret: SecretStr | None = None
    """The key of the HMAC-SHA256 signature on callbacks of tokens without a secret of their own
    (``callback_tokens``). Unset: such tokens' submissions naming a callback are refused."""
    callback_tokens: SecretStr | None = None
    """Per-token callbacks, JSON: ``{"<api token>": {"url": "https://...", "secret": "..."}}``. ``url`` is where
    a job of that token calls back when its spec names no callback; ``secret`` signs that token's callbacks
    instead of ``callback_secret``. Each token must be one of ``api_tokens`` or ``admin_tokens``."""
    callback_allowed_hosts: CommaList = Field(default_factory=list)
    """The hosts callbacks may go to: host names, ``*.domain`` wildcards (names below the domain) and networks
    (``10.2.0.0/16``, ``203.0.113.7``). Empty: every callback is refused. A loopback, private, link-local,
    multicast, reserved or unspecified address is refused unless a listed network contains it."""
    callback_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long one callback request may take; a delivery's lease is this plus ``lease_seconds``."""
    callback_max_attempts: int = Field(default=12, ge=1)
    callback_max_age_seconds: float = Field(default=86400.0, gt=0)
    """A callback not delivered this long after its job ended is given up on (``failed``)."""
    callback_backoff_base_seconds: float = Field(default=1.0, gt=0)
    callback_backoff_max_seconds: float = Field(default=600.0, gt=0)
    callback_poll_interval_seconds: float = Field(default=1.0, gt=0)
    """How often a worker looks for due callbacks (it looks at once when one of its own jobs ends)."""

    @field_validator("lake_roots", "api_tokens", "admin_tokens", "callback_allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return _split_commas(value)

    @field_validator("callback_allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: list[str]) -> list[str]:
        from service.callback_urls import Allowlist

        Allowlist.parse(value)  # raises ValueError naming an entry that is neither a host name nor a network
        return value

    @model_validator(mode="after")
    def _heartbeat_inside_lease(self) -> Settings:
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("heartbeat_seconds must be shorter than lease_seconds")
        if not self.lake_roots:
            raise ValueError("at least one lake root is required")
        return self

    @model_validator(mode="after")
    def _callback_tokens(self) -> Settings:
        """Every token's callback settings must work before the service takes a request."""
        from service.callback_keys import parse_callback_tokens
        from service.callback_urls import CallbackUrlError, check_target, parse_callback_url

        if self.callback_tokens is None:
            return self
        entries = parse_callback_tokens(self.callback_tokens.get_secret_value(), [*self.api_tokens, *self.admin_tokens])
        for position, entry in enumerate(entries.values(), start=1):
            if entry.url is None:
                continue
            if entry.key is None and self.callback_secret is None:
                raise ValueError(
                    f"callback_tokens: entry {position} has a url but no secret, and callback_secret is not set"
                )
            try:
                check_target(parse_callback_url(entry.url), self)
            except CallbackUrlError as exc:
                raise ValueError(f"callback_tokens: entry {position}: url: {exc}") from None
        return self


MAX_DEFAULT_API_PROCESSES = 4


def default_api_processes(command: str, database_url: str) -> int:
    """One process for ``serve`` and for SQLite, whose one writer at a time makes processes queue on its file
    lock (the latency tail grows with each process); one per CPU otherwise."""
    if command == "serve" or database_url.startswith("sqlite"):
        return 1
    return max(1, min(MAX_DEFAULT_API_PROCESSES, os.cpu_count() or 1))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
