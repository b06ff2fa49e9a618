"""Configuration from ``MERGE_SERVICE_*`` environment variables (the contract's table, plus operating knobs)."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

CommaList = Annotated[list[str], NoDecode]


def _split_commas(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Everything a deployment can change. Defaults are the embedded, single-machine setup."""

    model_config = SettingsConfigDict(env_prefix="MERGE_SERVICE_", extra="ignore")

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

    @field_validator("lake_roots", "api_tokens", "admin_tokens", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return _split_commas(value)

    @model_validator(mode="after")
    def _heartbeat_inside_lease(self) -> Settings:
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("heartbeat_seconds must be shorter than lease_seconds")
        if not self.lake_roots:
            raise ValueError("at least one lake root is required")
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
