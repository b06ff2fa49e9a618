"""The end-to-end tests use the service tests' PostgreSQL server where the job database must be production's (Delta
on Spark, where a job runs as Delta's own MERGE, comes from the root conftest)."""

from tests.service.conftest import postgres_server

__all__ = ["postgres_server"]
