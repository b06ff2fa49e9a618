"""Alembic driven from code: ``merge-service migrate`` and the readiness check's "schema at head"."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

# Package data of ``service``, so a non-editable install (the container image's) carries its migrations.
MIGRATIONS_DIR = Path(str(files("service") / "migrations"))


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(engine: Engine) -> None:
    """Bring the job table up to the newest revision (idempotent)."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
        conn.commit()


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """Read directly (readiness probes call this often; Alembic's context would log on every call)."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()


def at_head(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
